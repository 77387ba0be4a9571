use loops::Workflow;
use serde::{Deserialize, Serialize};

// Unknown and repeated keys are all reported at once.
#[derive(Workflow, Serialize, Deserialize)]
#[workflow(nmae = "deliver", version = 1, retries(3))]
#[workflow(version = 2)]
enum Deliver {
    #[initial]
    #[next(Done)]
    Received { issue: String },
    #[terminal]
    Done,
}

fn main() {}
