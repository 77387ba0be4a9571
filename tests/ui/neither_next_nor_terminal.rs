use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(Planned)]
    Received { issue: String },
    Planned { plan: String },
    #[terminal]
    Done,
}

fn main() {}
