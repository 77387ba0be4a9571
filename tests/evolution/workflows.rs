//! Three versions of the workflow `order`, their migrations, and handlers that log every side
//! effect (with its idempotency key) so that tests can count them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use loops::{BoxError, Context, Migrate};
use tokio::sync::Notify;

/// Version 1: placed, packed, shipped.
pub mod v1 {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "order", version = 1)]
    pub enum Order {
        #[initial]
        #[next(Packed)]
        Placed { item: String },
        #[next(Shipped)]
        Packed { item: String, boxes: u32 },
        #[terminal]
        Shipped { item: String },
    }
}

/// Version 2: a quantity everywhere (breaking: a new field without a default) and a new
/// state `Checked` between `Packed` and `Shipped`.
pub mod v2 {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "order", version = 2)]
    pub enum Order {
        #[initial]
        #[next(Packed)]
        Placed { item: String, qty: u32 },
        #[next(Checked)]
        Packed { item: String, qty: u32, boxes: u32 },
        #[next(Shipped)]
        Checked { item: String, qty: u32 },
        #[terminal]
        Shipped { item: String, qty: u32 },
    }
}

/// Version 3: `item` renamed `sku` (breaking) in every state.
pub mod v3 {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "order", version = 3)]
    pub enum Order {
        #[initial]
        #[next(Packed)]
        Placed { sku: String, qty: u32 },
        #[next(Checked)]
        Packed { sku: String, qty: u32, boxes: u32 },
        #[next(Shipped)]
        Checked { sku: String, qty: u32 },
        #[terminal]
        Shipped { sku: String, qty: u32 },
    }
}

/// Version 2 again, with a migration that returns an error for every run.
pub mod v2_refuses {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "order", version = 2)]
    pub enum Order {
        #[initial]
        #[next(Packed, Shipped)]
        Placed { item: String, refused: bool },
        #[next(Shipped)]
        Packed { item: String, refused: bool },
        #[terminal]
        Shipped { item: String },
    }
}

/// Version 2 again, with a migration that panics.
pub mod v2_panics {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "order", version = 2)]
    pub enum Order {
        #[initial]
        #[next(Packed, Shipped)]
        Placed { item: String, panics: bool },
        #[next(Shipped)]
        Packed { item: String, panics: bool },
        #[terminal]
        Shipped { item: String },
    }
}

/// Version 2 again, whose migration ends every packed order: another system ships them.
pub mod v2_ships {
    use loops::Workflow;
    use serde::{Deserialize, Serialize};

    #[derive(Workflow, Serialize, Deserialize, Debug, Clone, PartialEq)]
    #[workflow(name = "order", version = 2)]
    pub enum Order {
        #[initial]
        #[next(Shipped)]
        Placed { item: String, by: String },
        #[terminal]
        Shipped { item: String, by: String },
    }
}

impl Migrate<v1::Order> for v2_ships::Order {
    fn migrate(old: v1::Order) -> Result<Self, BoxError> {
        Ok(match old {
            v1::Order::Placed { item } => v2_ships::Order::Placed {
                item,
                by: "us".into(),
            },
            v1::Order::Packed { item, .. } | v1::Order::Shipped { item } => {
                v2_ships::Order::Shipped {
                    item,
                    by: "carrier".into(),
                }
            }
        })
    }
}

impl Migrate<v1::Order> for v2::Order {
    fn migrate(old: v1::Order) -> Result<Self, BoxError> {
        Ok(match old {
            v1::Order::Placed { item } => v2::Order::Placed { item, qty: 1 },
            v1::Order::Packed { item, boxes } => v2::Order::Packed {
                item,
                qty: 1,
                boxes,
            },
            v1::Order::Shipped { item } => v2::Order::Shipped { item, qty: 1 },
        })
    }
}

impl Migrate<v2::Order> for v3::Order {
    fn migrate(old: v2::Order) -> Result<Self, BoxError> {
        Ok(match old {
            v2::Order::Placed { item, qty } => v3::Order::Placed { sku: item, qty },
            v2::Order::Packed { item, qty, boxes } => v3::Order::Packed {
                sku: item,
                qty,
                boxes,
            },
            v2::Order::Checked { item, qty } => v3::Order::Checked { sku: item, qty },
            v2::Order::Shipped { item, qty } => v3::Order::Shipped { sku: item, qty },
        })
    }
}

impl Migrate<v1::Order> for v2_refuses::Order {
    fn migrate(old: v1::Order) -> Result<Self, BoxError> {
        Err(format!("refusing to migrate {old:?}").into())
    }
}

impl Migrate<v1::Order> for v2_panics::Order {
    fn migrate(old: v1::Order) -> Result<Self, BoxError> {
        panic!("cannot migrate {old:?}")
    }
}

/// Idempotency keys by `(run id, state seq)`, in the order they were given.
pub type Keys = BTreeMap<(String, u64), Vec<String>>;

/// What the handlers did, shared by every handler of a test.
#[derive(Default, Clone)]
pub struct Log {
    /// `(run id, step name)` of every side effect that ran, in order.
    pub effects: Arc<Mutex<Vec<(String, String)>>>,
    /// The idempotency key of the step `probe`, by run id and state seq, each time a handler
    /// asked for it.
    pub keys: Arc<Mutex<Keys>>,
    /// `(run id, version, state)` of every handler call.
    pub calls: Arc<Mutex<Vec<(String, u32, String)>>>,
}

impl Log {
    /// The side effects of `run_id`, by step name.
    pub fn effects_of(&self, run_id: &str) -> Vec<String> {
        self.effects
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _)| r == run_id)
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// The handler calls of `run_id`, as `(version, state)`.
    pub fn calls_of(&self, run_id: &str) -> Vec<(u32, String)> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(r, _, _)| r == run_id)
            .map(|(_, v, s)| (*v, s.clone()))
            .collect()
    }
}

/// A handler of any version: logs its call, the key `probe`, and runs the state's side
/// effect as a journaled step (`effect`); stops for good (the future never resolves) in
/// state `stop_at`, after the step, telling `reached`.
#[derive(Clone)]
pub struct Handler {
    pub version: u32,
    pub log: Log,
    pub stop_at: Option<&'static str>,
    pub reached: Arc<Notify>,
}

impl Handler {
    pub fn new(version: u32, log: &Log) -> Handler {
        Handler {
            version,
            log: log.clone(),
            stop_at: None,
            reached: Arc::new(Notify::new()),
        }
    }

    pub fn stopping_at(mut self, state: &'static str) -> Handler {
        self.stop_at = Some(state);
        self
    }

    async fn visit(&self, ctx: &Context, state: &str, effect: &str) -> anyhow::Result<()> {
        let run = ctx.run_id().to_owned();
        self.log
            .calls
            .lock()
            .unwrap()
            .push((run.clone(), self.version, state.to_owned()));
        let key = ctx.idempotency_key("probe")?;
        self.log
            .keys
            .lock()
            .unwrap()
            .entry((run.clone(), ctx.seq()))
            .or_default()
            .push(key);
        let log = self.log.clone();
        let effect_name = effect.to_owned();
        ctx.step(effect, || async {
            log.effects
                .lock()
                .unwrap()
                .push((run.clone(), effect_name.clone()));
            Ok(())
        })
        .await?;
        if self.stop_at == Some(state) {
            self.reached.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

impl v1::OrderHandler for Handler {
    type Error = anyhow::Error;

    async fn placed(&self, ctx: &Context, item: String) -> anyhow::Result<v1::PlacedNext> {
        self.visit(ctx, "Placed", "reserve").await?;
        Ok(v1::PlacedNext::Packed { item, boxes: 1 })
    }

    async fn packed(
        &self,
        ctx: &Context,
        item: String,
        _boxes: u32,
    ) -> anyhow::Result<v1::PackedNext> {
        self.visit(ctx, "Packed", "weigh").await?;
        Ok(v1::PackedNext::Shipped { item })
    }
}

impl v2::OrderHandler for Handler {
    type Error = anyhow::Error;

    async fn placed(
        &self,
        ctx: &Context,
        item: String,
        qty: u32,
    ) -> anyhow::Result<v2::PlacedNext> {
        self.visit(ctx, "Placed", "reserve").await?;
        Ok(v2::PlacedNext::Packed {
            item,
            qty,
            boxes: 2,
        })
    }

    async fn packed(
        &self,
        ctx: &Context,
        item: String,
        qty: u32,
        _boxes: u32,
    ) -> anyhow::Result<v2::PackedNext> {
        self.visit(ctx, "Packed", "weigh").await?;
        Ok(v2::PackedNext::Checked { item, qty })
    }

    async fn checked(
        &self,
        ctx: &Context,
        item: String,
        qty: u32,
    ) -> anyhow::Result<v2::CheckedNext> {
        self.visit(ctx, "Checked", "inspect").await?;
        Ok(v2::CheckedNext::Shipped { item, qty })
    }
}

impl v3::OrderHandler for Handler {
    type Error = anyhow::Error;

    async fn placed(&self, ctx: &Context, sku: String, qty: u32) -> anyhow::Result<v3::PlacedNext> {
        self.visit(ctx, "Placed", "reserve").await?;
        Ok(v3::PlacedNext::Packed { sku, qty, boxes: 3 })
    }

    async fn packed(
        &self,
        ctx: &Context,
        sku: String,
        qty: u32,
        _boxes: u32,
    ) -> anyhow::Result<v3::PackedNext> {
        self.visit(ctx, "Packed", "weigh").await?;
        Ok(v3::PackedNext::Checked { sku, qty })
    }

    async fn checked(
        &self,
        ctx: &Context,
        sku: String,
        qty: u32,
    ) -> anyhow::Result<v3::CheckedNext> {
        self.visit(ctx, "Checked", "inspect").await?;
        Ok(v3::CheckedNext::Shipped { sku, qty })
    }
}

impl v2_refuses::OrderHandler for Handler {
    type Error = anyhow::Error;

    async fn placed(
        &self,
        _: &Context,
        item: String,
        _: bool,
    ) -> anyhow::Result<v2_refuses::PlacedNext> {
        Ok(v2_refuses::PlacedNext::Shipped { item })
    }

    async fn packed(
        &self,
        _: &Context,
        item: String,
        _: bool,
    ) -> anyhow::Result<v2_refuses::PackedNext> {
        Ok(v2_refuses::PackedNext::Shipped { item })
    }
}

impl v2_ships::OrderHandler for Handler {
    type Error = anyhow::Error;

    async fn placed(
        &self,
        ctx: &Context,
        item: String,
        by: String,
    ) -> anyhow::Result<v2_ships::PlacedNext> {
        self.visit(ctx, "Placed", "reserve").await?;
        Ok(v2_ships::PlacedNext::Shipped { item, by })
    }
}

impl v2_panics::OrderHandler for Handler {
    type Error = anyhow::Error;

    async fn placed(
        &self,
        _: &Context,
        item: String,
        _: bool,
    ) -> anyhow::Result<v2_panics::PlacedNext> {
        Ok(v2_panics::PlacedNext::Shipped { item })
    }

    async fn packed(
        &self,
        _: &Context,
        item: String,
        _: bool,
    ) -> anyhow::Result<v2_panics::PackedNext> {
        Ok(v2_panics::PackedNext::Shipped { item })
    }
}
