use loops::Workflow;
use serde::{Deserialize, Serialize};

// A payload type that does not exist is reported at the type, as written.
#[derive(Workflow, Serialize, Deserialize)]
#[event(approve: Approval)]
enum Deliver {
    #[initial]
    #[next(Done)]
    Received { issue: String },
    #[terminal]
    Done,
}

fn main() {}
