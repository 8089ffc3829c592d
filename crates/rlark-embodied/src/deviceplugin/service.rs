//! The `v1beta1.DevicePlugin` gRPC service the kubelet calls.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use rlark_proto::deviceplugin::v1beta1 as api;
use rlark_proto::deviceplugin::v1beta1::device_plugin_server::DevicePlugin;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::inventory::Inventory;

/// The options this plugin registers with: no PreStartContainer, GetPreferredAllocation
/// available.
pub fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// One serving of the plugin socket; its ListAndWatch streams end when `stop` is cancelled.
pub struct PluginService {
    pub inventory: Arc<Inventory>,
    pub devices: watch::Receiver<Vec<api::Device>>,
    pub stop: CancellationToken,
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _request: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    /// The device list now, then again whenever a device's health changes. A slow reader
    /// only ever gets the latest list (a watch channel, never a queue).
    async fn list_and_watch(
        &self,
        _request: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let stream = WatchStream::new(self.devices.clone())
            .map(|devices| Ok(api::ListAndWatchResponse { devices }))
            .take_until(self.stop.clone().cancelled_owned());
        tracing::info!("kubelet opened ListAndWatch");
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|c| {
                let size = usize::try_from(c.allocation_size).map_err(|_| {
                    Status::invalid_argument(format!(
                        "allocation_size {} is negative",
                        c.allocation_size
                    ))
                })?;
                Ok(api::ContainerPreferredAllocationResponse {
                    device_i_ds: self.inventory.preferred(
                        &c.available_device_i_ds,
                        &c.must_include_device_i_ds,
                        size,
                    ),
                })
            })
            .collect::<Result<_, Status>>()?;
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for container in &request.get_ref().container_requests {
            let response = self
                .inventory
                .allocate(&container.devices_ids)
                .map_err(|message| {
                    tracing::warn!(devices = ?container.devices_ids, %message, "allocation refused");
                    Status::invalid_argument(message)
                })?;
            tracing::info!(devices = ?container.devices_ids, "allocated");
            container_responses.push(response);
        }
        Ok(Response::new(api::AllocateResponse {
            container_responses,
        }))
    }

    /// Registered with `pre_start_required: false`, so the kubelet does not call this; a
    /// call has nothing to prepare and succeeds.
    async fn pre_start_container(
        &self,
        _request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}
