// A step's output is recorded as JSON: a type without `Serialize` and `Deserialize` is refused
// at the call, with a message that says why.
use loops::{Context, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Fetch {
    #[initial]
    #[next(Done)]
    Start,
    #[terminal]
    Done,
}

struct Page {
    body: String,
}

struct Agent;

impl FetchHandler for Agent {
    type Error = loops::Error;

    async fn start(&self, ctx: &Context) -> Result<StartNext, Self::Error> {
        let page = ctx
            .step("fetch", || async {
                Ok(Page {
                    body: "<html>".to_owned(),
                })
            })
            .await?;
        let _ = page.body;
        Ok(StartNext::Done)
    }
}

fn main() {}
