//! The workflow `ticket`, whose version 2 claims to accept version 1's runs (a field added
//! with `#[serde(default)]`: compatible), and a wrong claim (a field retyped: breaking).

use loops::Context;

/// The stored (pinned) schema hash of [`v1::Ticket`], as the claims below spell it; the
/// test `the_claims_name_version_1` checks it.
pub const V1_HASH: &str = "60714ac8ca0b9f06";

pub mod v1 {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 1)]
    pub enum Ticket {
        #[initial]
        #[next(Closed)]
        Open { title: String },
        #[terminal]
        Closed { title: String },
    }
}

pub mod v2 {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 2, accepts = ["60714ac8ca0b9f06"])]
    pub enum Ticket {
        #[initial]
        #[next(Closed)]
        Open {
            title: String,
            #[serde(default)]
            labels: Vec<String>,
        },
        #[terminal]
        Closed { title: String },
    }
}

pub mod wrong {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 2, accepts = ["60714ac8ca0b9f06"])]
    pub enum Ticket {
        #[initial]
        #[next(Closed)]
        Open { title: u64 },
        #[terminal]
        Closed { title: String },
    }
}

/// A claim that holds only for runs in some states: `Closed` stored under another name breaks
/// a run whose records are in `Closed`, and no other.
pub mod partly {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 2, accepts = ["60714ac8ca0b9f06"])]
    pub enum Ticket {
        #[initial]
        #[next(Closed)]
        Open { title: String },
        #[terminal]
        #[serde(rename = "Done")]
        Closed { title: String },
    }
}

/// The claim of [`v2`] with the hash a user gets by printing `v1::Ticket::SCHEMA_HASH`
/// (before loops' format is folded in: no run has it); the test `the_claims_name_version_1`
/// checks it.
pub mod unpinned {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "ticket", version = 2, accepts = ["7d9429e48700892d"])]
    pub enum Ticket {
        #[initial]
        #[next(Closed)]
        Open {
            title: String,
            #[serde(default)]
            labels: Vec<String>,
        },
        #[terminal]
        Closed { title: String },
    }
}

/// Closes tickets; stops for good in `Open` if `stop`, telling `reached`.
#[derive(Clone, Default)]
pub struct Closer {
    pub stop: bool,
    pub reached: std::sync::Arc<tokio::sync::Notify>,
}

impl Closer {
    async fn open(&self) {
        if self.stop {
            self.reached.notify_one();
            std::future::pending::<()>().await;
        }
    }
}

impl v1::TicketHandler for Closer {
    type Error = anyhow::Error;

    async fn open(&self, _: &Context, title: String) -> anyhow::Result<v1::OpenNext> {
        Closer::open(self).await;
        Ok(v1::OpenNext::Closed { title })
    }
}

impl v2::TicketHandler for Closer {
    type Error = anyhow::Error;

    async fn open(
        &self,
        _: &Context,
        title: String,
        labels: Vec<String>,
    ) -> anyhow::Result<v2::OpenNext> {
        anyhow::ensure!(labels.is_empty(), "an accepted v1 run has no labels");
        Closer::open(self).await;
        Ok(v2::OpenNext::Closed { title })
    }
}

impl wrong::TicketHandler for Closer {
    type Error = anyhow::Error;

    async fn open(&self, _: &Context, title: u64) -> anyhow::Result<wrong::OpenNext> {
        Ok(wrong::OpenNext::Closed {
            title: title.to_string(),
        })
    }
}

impl partly::TicketHandler for Closer {
    type Error = anyhow::Error;

    async fn open(&self, _: &Context, title: String) -> anyhow::Result<partly::OpenNext> {
        Ok(partly::OpenNext::Closed { title })
    }
}

impl unpinned::TicketHandler for Closer {
    type Error = anyhow::Error;

    async fn open(
        &self,
        _: &Context,
        title: String,
        _: Vec<String>,
    ) -> anyhow::Result<unpinned::OpenNext> {
        Ok(unpinned::OpenNext::Closed { title })
    }
}
