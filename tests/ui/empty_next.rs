use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(Done)]
    Received { issue: String },
    #[next()]
    Stuck,
    #[terminal]
    Done,
}

fn main() {}
