use loops::{Context, Runtime, Schema, Workflow};
use serde::{Deserialize, Serialize};

#[derive(Schema, Serialize, Deserialize)]
struct Approval {
    by: String,
}

#[derive(Workflow, Serialize, Deserialize)]
#[event(approve: Approval)]
enum Deliver {
    #[initial]
    #[next(Done)]
    Received { issue: String },
    #[terminal]
    Done,
}

// The declared event fixes the payload's type: another type does not compile, on either side.
async fn send(runtime: &Runtime) {
    let _ = runtime.send("run", Deliver::APPROVE, &"alice").await;
}

async fn wait(ctx: &Context) {
    let _: Result<String, _> = ctx.wait_for(Deliver::APPROVE).await;
}

fn main() {
    let _ = (send, wait);
}
