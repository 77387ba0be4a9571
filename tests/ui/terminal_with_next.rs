use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(Done)]
    Received { issue: String },
    #[terminal]
    #[next(Received)]
    Done,
}

fn main() {}
