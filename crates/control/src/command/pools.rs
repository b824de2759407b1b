//! What nodes report about their storage pools.

use trireme_types::NodeId;

use super::error::CommandError;
use super::{PoolReport, Reply};
use crate::model::ClusterState;

impl ClusterState {
    pub(super) fn report_pools(
        &mut self,
        node: NodeId,
        pools: Vec<PoolReport>,
    ) -> Result<Reply, CommandError> {
        let record = self
            .nodes
            .get_mut(&node)
            .ok_or(CommandError::UnknownNode { node })?;
        record.pools = pools
            .into_iter()
            .map(|pool| (pool.name, pool.record))
            .collect();
        Ok(Reply::Done)
    }
}
