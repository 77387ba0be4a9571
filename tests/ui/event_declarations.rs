use loops::{Schema, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Schema, Serialize, Deserialize)]
struct Approval {
    by: String,
}

// A duplicate event name (also as the constant's name) and a payload type that does not
// exist are reported at what the user wrote; so is `#[event]` on a state.
#[derive(Workflow, Serialize, Deserialize)]
#[event(approve: Approval, Approve: Approval)]
#[event(approve: Approval)]
#[event(reject: Rejection)]
enum Deliver {
    #[initial]
    #[next(Done)]
    #[event(other: Approval)]
    Received { issue: String },
    #[terminal]
    Done,
}

fn main() {}
