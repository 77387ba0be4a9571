use loops::Workflow;
use serde::{Deserialize, Serialize};

#[derive(Workflow, Serialize, Deserialize)]
#[workflow(name = deliver, version = "1")]
enum A {
    #[initial]
    #[next(ADone)]
    AReceived,
    #[terminal]
    ADone,
}

#[derive(Workflow, Serialize, Deserialize)]
#[workflow(name = "", version = 1.5)]
enum B {
    #[initial]
    #[next(BDone)]
    BReceived,
    #[terminal]
    BDone,
}

#[derive(Workflow, Serialize, Deserialize)]
#[workflow(name = "deliver issues", version = -1)]
enum C {
    #[initial]
    #[next(CDone)]
    CReceived,
    #[terminal]
    CDone,
}

#[derive(Workflow, Serialize, Deserialize)]
#[workflow(name, version = 5000000000)]
enum D {
    #[initial]
    #[next(DDone)]
    DReceived,
    #[terminal]
    DDone,
}

#[derive(Workflow, Serialize, Deserialize)]
#[workflow]
enum E {
    #[initial]
    #[next(EDone)]
    EReceived,
    #[terminal]
    EDone,
}

fn main() {}
