use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[next(Done)]
    Received { issue: String },
    #[terminal]
    Done,
}

fn main() {}
