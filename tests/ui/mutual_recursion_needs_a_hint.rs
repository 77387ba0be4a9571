// `Folder` and `File` contain each other; without `#[schema(recursive = Folder)]` on one of
// the fields, their shapes would be infinite.
use loops::Schema;
use serde::{Deserialize, Serialize};

#[derive(Schema, Serialize, Deserialize)]
struct Folder {
    files: Vec<File>,
}

#[derive(Schema, Serialize, Deserialize)]
struct File {
    subfolder: Option<Box<Folder>>,
}

fn main() {
    let _ = <Folder as Schema>::SHAPE;
}
