use loops::Workflow;
use serde::{Deserialize, Serialize};

// `accepts` lists stored schema hashes, 16 hex digits each, as `loops schema` prints them.
#[derive(Workflow, Serialize, Deserialize)]
#[workflow(name = "deliver", version = 2, accepts = ["5a1f", "00000000000000ff", 7, "00000000000000FF", "zz00000000000000"])]
enum Deliver {
    #[initial]
    #[next(Done)]
    Received { issue: String },
    #[terminal]
    Done,
}

#[derive(Workflow, Serialize, Deserialize)]
#[workflow(accepts = "00000000000000ff")]
enum Review {
    #[initial]
    #[next(Done)]
    Open,
    #[terminal]
    Done,
}

fn main() {}
