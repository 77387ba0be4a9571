use loops::Workflow;
use serde::{Deserialize, Serialize};

// `next_prefix` must be a string that starts a type name.
#[derive(Workflow, Serialize, Deserialize)]
#[workflow(name = "a", next_prefix = "1st")]
enum First {
    #[initial]
    #[next(Done)]
    Start,
    #[terminal]
    Done,
}

#[derive(Workflow, Serialize, Deserialize)]
#[workflow(name = "b", next_prefix = Second)]
enum Second {
    #[initial]
    #[next(Done)]
    Begin,
    #[terminal]
    Done,
}

fn main() {}
