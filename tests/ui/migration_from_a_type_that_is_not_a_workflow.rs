use loops::{BoxError, Migrate, Workflow};
use serde::{Deserialize, Serialize};

// Runs store workflow states: a migration reads one, not any type.
#[derive(Workflow, Serialize, Deserialize)]
#[workflow(name = "deliver", version = 2)]
enum Deliver {
    #[initial]
    #[next(Done)]
    Received { issue: u64 },
    #[terminal]
    Done,
}

impl Migrate<String> for Deliver {
    fn migrate(old: String) -> Result<Self, BoxError> {
        Ok(Deliver::Received { issue: old.len() as u64 })
    }
}

fn main() {}
