use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver<T> {
    #[initial]
    #[next(Done)]
    Received { issue: T },
    #[terminal]
    Done,
}

fn main() {}
