use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
struct Deliver {
    issue: String,
}

fn main() {}
