// Handlers run on a multi-threaded runtime: a value that is not `Send` (an `Rc`) held across
// a step's `.await` makes the handler's future not `Send`, and the error names the value.
use std::rc::Rc;

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

struct Agent;

impl FetchHandler for Agent {
    type Error = loops::Error;

    async fn start(&self, ctx: &Context) -> Result<StartNext, Self::Error> {
        let shared = Rc::new(String::from("cache"));
        let n: usize = ctx.step("fetch", || async { Ok(3) }).await?;
        let _ = (shared.len(), n);
        Ok(StartNext::Done)
    }
}

fn main() {}
