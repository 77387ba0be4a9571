//! States whose records could not be read back: skipped, or renamed for one direction only.

mod skipped {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize)]
    enum Skipped {
        #[initial]
        #[next(Done)]
        Start,
        #[terminal]
        #[serde(skip_deserializing)]
        Done,
    }
}

mod renamed_one_way {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize)]
    enum RenamedOneWay {
        #[initial]
        #[next(Done)]
        #[serde(rename(serialize = "begin"))]
        Start,
        #[terminal]
        #[serde(rename(serialize = "end", deserialize = "finish"))]
        Done,
    }
}

mod rename_all_one_way {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize)]
    #[serde(rename_all(deserialize = "lowercase"))]
    enum RenameAllOneWay {
        #[initial]
        #[next(Done)]
        Start,
        #[terminal]
        Done,
    }
}

fn main() {}
