use loops::{Schema, Workflow};
use serde::{Deserialize, Serialize};

// `crate` twice, in one attribute or in two: the first is kept, the others are reported.
#[derive(Workflow, Serialize, Deserialize)]
#[workflow(crate = loops, crate = "loops")]
#[workflow(crate = ::loops)]
enum Twice {
    #[initial]
    #[next(TwiceDone)]
    TwiceReceived,
    #[terminal]
    TwiceDone,
}

// Not a path, or no value: reported at what was written. Nothing else is generated for these
// enums (it would name a path that may not exist), so nothing else is reported either.
#[derive(Workflow, Serialize, Deserialize)]
#[workflow(crate = 5, crate = "not a path", crate = Vec<u8>)]
enum NotAPath {
    #[initial]
    #[next(NotAPathDone)]
    NotAPathReceived,
    #[terminal]
    NotAPathDone,
}

#[derive(Workflow, Serialize, Deserialize)]
#[workflow(crate, name = "no_value")]
#[workflow(crate(loops))]
enum NoValue {
    #[initial]
    #[next(NoValueDone)]
    NoValueReceived,
    #[terminal]
    NoValueDone,
}

// On a type deriving `Schema`, `#[schema(...)]` takes `crate` only; on a field, no `crate`.
#[derive(Schema, Serialize, Deserialize)]
#[schema(crate = loops, crate = loops)]
#[schema(crate = "")]
struct Payload {
    #[schema(crate = loops)]
    n: u32,
}

#[derive(Schema, Serialize, Deserialize)]
#[schema(recursive = Tree, opaque)]
enum Tree {
    Leaf,
}

fn main() {}
