use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
#[initial]
enum Deliver {
    #[initial(first)]
    #[next]
    Received { issue: String },
    #[initial]
    #[next(Deliver::Done)]
    #[next(Done)]
    Planned {
        #[terminal]
        plan: String,
    },
    #[terminal = true]
    #[terminal]
    #[workflow(name = "done")]
    Done,
}

fn main() {}
