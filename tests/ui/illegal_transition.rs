use loops::{Context, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(Planned, Abandoned)]
    Received { issue: String },
    #[next(Edited)]
    Planned { issue: String, plan: String },
    #[terminal]
    Edited { issue: String, commit: String },
    #[terminal]
    Abandoned { reason: String },
}

struct Agent;

impl DeliverHandler for Agent {
    type Error = std::io::Error;

    async fn received(&self, _ctx: &Context, issue: String) -> Result<ReceivedNext, Self::Error> {
        // Skips planning: `Received` may only move to `Planned` or `Abandoned`.
        Ok(ReceivedNext::Edited { issue, commit: String::new() })
    }

    async fn planned(&self, _ctx: &Context, issue: String, _plan: String) -> Result<PlannedNext, Self::Error> {
        Ok(PlannedNext::Edited { issue, commit: String::new() })
    }
}

fn main() {}
