use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(Polling, Done)]
    Received { issue: String },
    // Once polling, a run only ever polls again.
    #[next(Polling)]
    Polling { attempts: u32 },
    #[terminal]
    Done,
}

fn main() {}
