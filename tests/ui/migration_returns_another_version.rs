use loops::{BoxError, Migrate};
use serde::{Deserialize, Serialize};

// `migrate` returns the version it is implemented on, not the one it reads.
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

impl Migrate<v1::Deliver> for Deliver {
    fn migrate(old: v1::Deliver) -> Result<v1::Deliver, BoxError> {
        Ok(old)
    }
}

fn main() {}
