use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(Done)]
    Received { issue: String },
    // Nothing moves to `Planned`.
    #[next(Done)]
    Planned { plan: String },
    #[terminal]
    Done,
}

fn main() {}
