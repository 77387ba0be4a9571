use loops::{Schema, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Schema, Serialize, Deserialize)]
struct Approval {
    by: String,
}

// A duplicate event name (also as the constant's name) is reported at the second; `#[event]`
// on a state at the attribute.
#[derive(Workflow, Serialize, Deserialize)]
#[event(approve: Approval, Approve: Approval)]
#[event(approve: Approval)]
enum Deliver {
    #[initial]
    #[next(Done)]
    #[event(other: Approval)]
    Received { issue: String },
    #[terminal]
    Done,
}

fn main() {}
