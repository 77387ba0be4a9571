use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[nxt(Done)]
    Received { issue: String },
    #[terminal]
    Done,
}

fn main() {}
