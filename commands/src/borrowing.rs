//! Provider pools borrow their capacity: a reservation that does not fit waits, and the pool's provider round
//! acquires a machine for it through the account's provider driver (`bcx`), registers the machine as a node of
//! the pool once the provider says it is ready (the waiting reservation is then placed on it like on any other),
//! and gives the machine back once the reservation is over and nothing is booked on its node.
//!
//! The round calls the driver outside any transaction; each acquire's key is the reservation's id, so a round
//! that died between the acquire and recording it finds the same machine next time.

use std::collections::BTreeMap;
use std::sync::Arc;

use bc_domain::device::GpuInfo;
use bc_domain::id::{NodeId, PoolId};
use bc_domain::node::{Role, Trust};
use bc_domain::reservation::{self, Command, FailureReason};
use bc_eventstore::lease::Lease;
use bc_eventstore::queue::{self, WorkItem};
use bc_eventstore::{ScopedFutureExt as _, TxOptions, clock};
use bcx::client::{CallError, DriverClient};
use bcx::protocol::{Account, AcquireRequest, ErrorCode, ListRequest, Machine, MachineState, ReleaseRequest};

use crate::nodes::RegisterNode;
use crate::reservations::apply_and_schedule;
use crate::store::provider_machines::{self, Held, ProviderPool};
use crate::work::{self, WorkKey, fenced};
use crate::{App, AppResult, Caller};

/// The provider drivers the control plane calls, by the provider kind accounts name (`better-compute`).
#[derive(Debug, Clone, Default)]
pub struct ProviderDrivers(BTreeMap<String, DriverClient>);

impl ProviderDrivers {
    pub fn with(mut self, provider: &str, client: DriverClient) -> Self {
        self.0.insert(provider.to_owned(), client);
        self
    }

    pub fn get(&self, provider: &str) -> Option<&DriverClient> {
        self.0.get(provider)
    }
}

/// How long after a round with a machine still being acquired the next one runs.
const ACQUIRING_POLL_MS: i64 = 1_000;
/// How long after a round with machines held the next one runs (to give back those no longer needed).
const HELD_POLL_MS: i64 = 10_000;
/// How long a machine is asked for beyond its reservation's window.
const MARGIN_S: u64 = 600;

impl App {
    /// The provider drivers this control plane calls.
    pub fn with_provider_drivers(mut self, drivers: ProviderDrivers) -> Self {
        self.providers = Arc::new(drivers);
        self
    }

    /// One provider round of `pool` (its work item `pool:<id>:provider`): acquire for the waiting reservations,
    /// register the machines that became ready, give back those no longer needed; then look again while it holds
    /// any.
    pub(crate) async fn run_provider_item(
        &self,
        item: &WorkItem,
        pool: &PoolId,
        fence: Option<&Lease>,
    ) -> AppResult<()> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let facts = provider_machines::round_facts(&mut tx, pool).await?;
        tx.commit().await?;
        let next = match facts {
            Some((provider, waiting, held)) => self.provider_round(pool, &provider, waiting, held).await?,
            None => None,
        };
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        fenced(&mut tx, fence).await?;
        match next {
            Some(at_ms) => queue::reschedule(&mut tx, item, at_ms).await?,
            None => queue::complete(&mut tx, item).await?,
        };
        tx.commit().await?;
        Ok(())
    }

    /// Returns when to look again (`None`: the pool holds nothing and nothing waits).
    async fn provider_round(
        &self,
        pool: &PoolId,
        provider: &ProviderPool,
        waiting: Vec<provider_machines::Waiting>,
        held: Vec<Held>,
    ) -> AppResult<Option<i64>> {
        let now_ms = self.now_ms().await?;
        let Some(client) = self.providers.get(&provider.provider) else {
            tracing::warn!(%pool, provider = %provider.provider, "no driver for the pool's provider: nothing is acquired");
            return Ok(None);
        };
        let Some(credential) = self.provider_credential(&provider.account_id).await? else {
            tracing::warn!(%pool, account = %provider.account_id, "the provider account has no credential");
            return Ok(None);
        };
        let account = Account {
            account_id: provider.account_id.to_string(),
            endpoint: provider.endpoint.clone(),
            settings: provider.settings.clone(),
            credential,
        };
        let mut acquiring = false;
        for reservation in &waiting {
            let request = AcquireRequest {
                account: account.clone(),
                key: reservation.reservation_id.clone(),
                gpus: reservation.count,
                gpu_model: provider.gpu_model.clone(),
                duration_s: reservation.duration_s + MARGIN_S,
            };
            match client.acquire(&request).await {
                Ok(machine) => {
                    let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
                    let (account_id, id) = (&provider.account_id, &reservation.reservation_id);
                    provider_machines::record_acquired(&mut tx, account_id, &machine.id, pool, id, now_ms).await?;
                    tx.commit().await?;
                    acquiring = true;
                }
                Err(CallError::Refused(err)) if err.code == ErrorCode::CapacityUnavailable => {
                    tracing::info!(%pool, reservation = %reservation.reservation_id, "the provider has no capacity now");
                    acquiring = true;
                }
                // Refused for good (the credential, the request): the reservation fails, saying so, rather than
                // waiting for its deadline.
                Err(CallError::Refused(err))
                    if matches!(err.code, ErrorCode::Unauthenticated | ErrorCode::InvalidArgument) =>
                {
                    tracing::warn!(
                        %pool, reservation = %reservation.reservation_id, error = %err,
                        "the provider refused to lend a machine: the reservation fails"
                    );
                    self.fail_waiting(&reservation.reservation_id).await?;
                }
                Err(err) => {
                    tracing::warn!(%pool, reservation = %reservation.reservation_id, error = %err, "acquire failed");
                    acquiring = true;
                }
            }
        }
        let mut listed: Option<Vec<Machine>> = None;
        let mut holding = false;
        for machine in held {
            if machine.reservation_over && !machine.node_busy {
                self.give_back(pool, provider, client, &account, &machine, now_ms).await?;
                continue;
            }
            holding = true;
            if machine.state != "acquiring" {
                continue;
            }
            acquiring = true;
            if listed.is_none() {
                match client.list(&ListRequest { account: account.clone() }).await {
                    Ok(machines) => listed = Some(machines),
                    Err(err) => {
                        tracing::warn!(%pool, error = %err, "listing the provider's machines failed");
                        break;
                    }
                }
            }
            let found = listed.as_ref().and_then(|all| all.iter().find(|m| m.id == machine.machine_id));
            match found.map(|m| m.state) {
                Some(MachineState::Ready) => {
                    let ready = found.cloned().unwrap_or_else(|| unreachable!("found"));
                    self.register_machine(pool, provider, &ready, now_ms).await?;
                }
                Some(MachineState::Failed | MachineState::Released) => {
                    let detail = found.and_then(|m| m.detail.clone());
                    let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
                    let (account_id, id) = (&provider.account_id, &machine.machine_id);
                    provider_machines::update(&mut tx, account_id, id, "failed", None, detail.as_deref(), now_ms)
                        .await?;
                    tx.commit().await?;
                }
                _ => {}
            }
        }
        Ok(if acquiring {
            Some(now_ms + ACQUIRING_POLL_MS)
        } else if holding || !waiting.is_empty() {
            Some(now_ms + HELD_POLL_MS)
        } else {
            None
        })
    }

    /// Registers a ready machine as a node of the pool, and wakes the pool's waiting reservations.
    async fn register_machine(
        &self,
        pool: &PoolId,
        provider: &ProviderPool,
        machine: &Machine,
        now_ms: i64,
    ) -> AppResult<()> {
        let owner = Caller { tenant_id: provider.owner.clone(), identity: provider_identity(), ..Caller::system() };
        let gpus = machine
            .gpus
            .iter()
            .map(|gpu| {
                let uuid = format!("{}:{}", provider.account_id, gpu.id);
                Ok(GpuInfo {
                    uuid: uuid
                        .parse()
                        .map_err(|err| bc_domain::Rejection::invalid("gpus", format!("{uuid}: {err}")))?,
                    name: bc_domain::gpu::nvml_name_for(&gpu.model).unwrap_or(&gpu.model).to_owned(),
                    memory_mib: gpu.memory_mib,
                    pci_bus_id: None,
                    mig_instances: Vec::new(),
                })
            })
            .collect::<AppResult<Vec<_>>>()?;
        let register = RegisterNode {
            pool_id: pool.clone(),
            name: machine.id.clone(),
            role: Role::Host,
            trust: Trust::Platform,
            owner_tenant_id: None,
            gpus,
            resources: BTreeMap::new(),
        };
        let node = self.register_node(&owner, register).await?.value;
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        let account = &provider.account_id;
        provider_machines::update(&mut tx, account, &machine.id, "ready", Some(node.as_str()), None, now_ms).await?;
        work::wake_now(&mut tx, &WorkKey::pool_pending(pool)).await?;
        tx.commit().await?;
        tracing::info!(%pool, machine = %machine.id, %node, "a provider machine joined the pool");
        Ok(())
    }

    /// Gives a machine no longer needed back to its provider and removes its node.
    async fn give_back(
        &self,
        pool: &PoolId,
        provider: &ProviderPool,
        client: &DriverClient,
        account: &Account,
        machine: &Held,
        now_ms: i64,
    ) -> AppResult<()> {
        let release = ReleaseRequest { account: account.clone(), machine_id: machine.machine_id.clone() };
        match client.release(&release).await {
            Ok(_) => {}
            Err(CallError::Refused(err)) if err.code == ErrorCode::NotFound => {}
            Err(err) => {
                tracing::warn!(%pool, machine = %machine.machine_id, error = %err, "giving a machine back failed");
                return Ok(());
            }
        }
        if let Some(node) = &machine.node_id {
            let node: NodeId = node.parse().map_err(|err| crate::store::corrupt("provider_machines.node_id", err))?;
            let owner = Caller { tenant_id: provider.owner.clone(), identity: provider_identity(), ..Caller::system() };
            let reason = Some(format!("its provider machine {} was given back", machine.machine_id));
            if let Err(err) = self.delete_node(&owner, &node, false, reason).await {
                tracing::warn!(%pool, %node, error = %err, "removing a given-back machine's node failed");
            }
        }
        let mut tx = self.db.begin(TxOptions::READ_COMMITTED).await?;
        provider_machines::update(&mut tx, &provider.account_id, &machine.machine_id, "released", None, None, now_ms)
            .await?;
        tx.commit().await?;
        tracing::info!(%pool, machine = %machine.machine_id, "a provider machine was given back");
        Ok(())
    }

    /// Fails a waiting reservation its provider refused to lend for.
    async fn fail_waiting(&self, id: &str) -> AppResult<()> {
        let id: bc_domain::id::ReservationId =
            id.parse().map_err(|err| crate::store::corrupt("reservations.id", err))?;
        let caller = Caller::system();
        self.db
            .transaction_with_retry(TxOptions::COMMAND, &self.retry, |tx| {
                let (id, caller) = (&id, &caller);
                async move {
                    let Some(r) = crate::store::reservation(tx, id).await? else { return Ok(()) };
                    let now_ms = clock::compute_now_ms(tx).await?;
                    let command = Command::Fail { reason: FailureReason::ProviderRefused, now_ms };
                    // Placed meanwhile, or ended: nothing to fail.
                    let Ok(events) = reservation::decide(&r, &command) else { return Ok(()) };
                    apply_and_schedule(tx, caller, r, events, now_ms).await?;
                    Ok(())
                }
                .scope_boxed()
            })
            .await
    }

    async fn now_ms(&self) -> AppResult<i64> {
        let mut tx = self.db.begin(TxOptions::READ_ONLY).await?;
        let now_ms = clock::compute_now_ms(&mut tx).await?;
        tx.commit().await?;
        Ok(now_ms)
    }
}

fn provider_identity() -> bc_domain::id::Identity {
    "system:provider".parse().unwrap_or_else(|_| Caller::system().identity)
}
