use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Issue {
    number: u64,
}

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(Done)]
    Received { issue: Issue },
    #[terminal]
    Done,
}

fn main() {}
