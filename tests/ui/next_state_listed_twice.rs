use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(Planned, Done, Planned)]
    Received { issue: String },
    #[next(Done)]
    Planned { plan: String },
    #[terminal]
    Done,
}

fn main() {}
