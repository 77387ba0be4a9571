//! Two states stored (or read) under one name: a record of one would be read back as the
//! other, and the run driven on in a state it was not in. (Each workflow in a module of its
//! own: the derive's generated items are named after the states.)

mod renamed {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize)]
    enum Renamed {
        #[initial]
        #[next(Charged)]
        Start { n: u32 },
        #[next(Done)]
        #[serde(rename = "Start")]
        Charged { n: u32 },
        #[terminal]
        Done { n: u32 },
    }
}

mod aliased {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Aliased {
        #[initial]
        #[next(Done)]
        Start,
        #[terminal]
        #[serde(alias = "start")]
        Done,
    }
}

mod untagged {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize)]
    #[serde(untagged)]
    enum Untagged {
        #[initial]
        #[next(Done)]
        Start { n: u32 },
        #[terminal]
        Done { n: u32 },
    }
}

mod untagged_state {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize)]
    enum UntaggedState {
        #[initial]
        #[next(Done)]
        Start { n: u32 },
        #[terminal]
        #[serde(untagged)]
        Done { n: u32 },
    }
}

mod other {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize)]
    #[serde(tag = "state")]
    enum Other {
        #[initial]
        #[next(Unknown)]
        Start,
        #[terminal]
        #[serde(other)]
        Unknown,
    }
}

fn main() {}
