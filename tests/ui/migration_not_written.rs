use serde::{Deserialize, Serialize};

// Registering a migration that nobody wrote.
mod v1 {
    #[derive(loops::Workflow, serde::Serialize, serde::Deserialize)]
    #[workflow(name = "deliver", version = 1)]
    pub enum Deliver {
        #[initial]
        #[next(Done)]
        Received { issue: u64 },
        #[terminal]
        Done,
    }
}

#[derive(loops::Workflow, Serialize, Deserialize)]
#[workflow(name = "deliver", version = 2)]
enum Deliver {
    #[initial]
    #[next(Done)]
    Received { issue: u64, title: String },
    #[terminal]
    Done,
}

fn main() {
    let _ = loops::Migration::of::<v1::Deliver, Deliver>();
}
