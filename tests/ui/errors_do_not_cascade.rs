// One mistake in the enum (an unknown next state) gives one error: the generated types still
// exist, so the handler impl and the code using them report nothing more.
use loops::{Context, StateId, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {
    #[initial]
    #[next(Planned, Edtied)]
    Received { issue: String },
    #[next(Done)]
    Planned { plan: String },
    #[terminal]
    Done,
}

struct Agent;

impl DeliverHandler for Agent {
    type Error = std::io::Error;

    async fn received(&self, _ctx: &Context, _issue: String) -> Result<ReceivedNext, Self::Error> {
        Ok(ReceivedNext::Planned { plan: String::new() })
    }

    async fn planned(&self, _ctx: &Context, _plan: String) -> Result<PlannedNext, Self::Error> {
        Ok(PlannedNext::Done)
    }
}

fn main() {
    assert_eq!(DeliverState::INITIAL.name(), "Received");
    assert_eq!(Deliver::NAME, "deliver");
}
