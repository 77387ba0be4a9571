use loops::{BoxError, Migrate, Workflow};
use serde::{Deserialize, Serialize};

// A migration goes between two versions of one workflow: `review` runs never become
// `deliver` runs.
mod review {
    #[derive(loops::Workflow, serde::Serialize, serde::Deserialize)]
    #[workflow(name = "review", version = 1)]
    pub enum Review {
        #[initial]
        #[next(Done)]
        Open { pr: u64 },
        #[terminal]
        Done,
    }
}

#[derive(Workflow, Serialize, Deserialize)]
#[workflow(name = "deliver", version = 2)]
enum Deliver {
    #[initial]
    #[next(Done)]
    Received { issue: u64 },
    #[terminal]
    Done,
}

impl Migrate<review::Review> for Deliver {
    fn migrate(old: review::Review) -> Result<Self, BoxError> {
        Ok(match old {
            review::Review::Open { pr } => Deliver::Received { issue: pr },
            review::Review::Done => Deliver::Done,
        })
    }
}

fn main() {}
