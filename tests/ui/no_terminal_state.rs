use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Forever {
    #[initial]
    #[next(Pong)]
    Ping,
    #[next(Ping)]
    Pong,
}

fn main() {}
