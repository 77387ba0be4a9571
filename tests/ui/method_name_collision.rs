use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(PROpened)]
    PrOpened,
    #[next(Done)]
    PROpened,
    #[terminal]
    Done,
}

fn main() {}
