use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
enum Deliver {}

fn main() {}
