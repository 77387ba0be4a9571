use loops::{Context, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(Planned)]
    Received { issue: String },
    #[next(Done)]
    Planned { issue: String, plan: String },
    #[terminal]
    Done,
}

struct Agent;

impl DeliverHandler for Agent {
    type Error = std::io::Error;

    async fn received(&self, _ctx: &Context, issue: String) -> Result<ReceivedNext, Self::Error> {
        Ok(ReceivedNext::Planned { issue, plan: String::new() })
    }
}

fn main() {}
