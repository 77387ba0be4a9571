use loops::{Schema, Workflow};
use serde::{Deserialize, Serialize};

// A `crate = path` that does not lead to loops: one error each, at the path (not one per
// generated item, at the derive).

// A typo.
#[derive(Workflow, Serialize, Deserialize)]
#[workflow(crate = loops_cor)]
enum Typo {
    #[initial]
    #[next(TypoDone)]
    TypoReceived { n: u32 },
    #[terminal]
    TypoDone,
}

// A crate that is not loops.
#[derive(Workflow, Serialize, Deserialize)]
#[workflow(crate = "std")]
enum NotLoops {
    #[initial]
    #[next(NotLoopsDone)]
    NotLoopsReceived { n: u32 },
    #[terminal]
    NotLoopsDone,
}

// This crate's root, which is not loops (loops-core's own tests write `crate = crate`).
#[derive(Schema, Serialize, Deserialize)]
#[schema(crate = crate)]
struct Root {
    n: u32,
}

fn main() {}
