use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(Planed, Merged)]
    Received { issue: String },
    #[next(PrOpened)]
    Planned { plan: String },
    #[terminal]
    PrOpened { url: String },
}

fn main() {}
