use loops::Schema;
use serde::{Deserialize, Serialize};

#[derive(Schema, Serialize, Deserialize)]
#[schema(as = String)]
struct Issue {
    #[schema(as = String, as = u64)]
    number: u64,
    #[schema(opaque)]
    title: String,
    #[schema]
    body: String,
}

#[derive(Schema, Serialize, Deserialize)]
enum Kind {
    #[schema(recursive = Kind)]
    A,
}

fn main() {}
