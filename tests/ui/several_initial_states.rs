use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(Done)]
    Received { issue: String },
    #[initial]
    #[next(Done)]
    Imported { issue: String },
    #[terminal]
    Done,
}

fn main() {}
