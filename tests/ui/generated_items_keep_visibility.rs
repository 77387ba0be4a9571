mod flows {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    // Private (inherited visibility): so are the generated items.
    #[derive(Workflow, Serialize, Deserialize)]
    enum Secret {
        #[initial]
        #[next(Done)]
        Start,
        #[terminal]
        Done,
    }
}

fn main() {
    let _ = flows::SecretState::Start;
}
