//! Networks: the instance's bridge network, each sandbox's isolated link
//! network, attaching containers to them and removing them.

use std::collections::HashMap;

use bollard::models::{Ipam, IpamConfig, NetworkConnectRequest, NetworkCreateRequest};
use bollard::query_parameters::ListNetworksOptions;

use super::{Engine, EngineError, EngineResult, label_filter};

/// A network as listed.
#[derive(Debug, Clone)]
pub struct NetworkRecord {
    pub name: String,
    pub labels: HashMap<String, String>,
    pub subnets: Vec<String>,
}

impl Engine {
    /// Creates the bridge network unless it exists. Inter-container traffic
    /// is off: sandboxes of different sessions must not reach each other.
    pub async fn ensure_network(
        &self,
        name: &str,
        labels: HashMap<String, String>,
    ) -> EngineResult<()> {
        let docker = self.docker()?;
        match docker
            .inspect_network(
                name,
                None::<bollard::query_parameters::InspectNetworkOptions>,
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => {}
                other => return Err(other),
            },
        }
        let options = HashMap::from([(
            "com.docker.network.bridge.enable_icc".to_string(),
            "false".to_string(),
        )]);
        let req = NetworkCreateRequest {
            name: name.to_string(),
            driver: Some("bridge".into()),
            labels: Some(labels),
            options: Some(options),
            ..Default::default()
        };
        match self
            .making(async move { docker.create_network(req).await })
            .await
        {
            Ok(_) => {
                tracing::info!(network = name, "created the sandbox network");
                Ok(())
            }
            // Lost a race with another create: the network is there.
            Err(EngineError::Conflict(_)) => Ok(()),
            Err(other) => Err(other),
        }
    }

    /// Creates an isolated network: internal (the engine routes nothing in
    /// or out) and with no address of the host on its bridge (the gateway
    /// address is never assigned), so its containers reach each other and
    /// nothing else, the host included; `subnet` pins the address range
    /// (an overlap is reported as a conflict).
    pub async fn create_isolated_network(
        &self,
        name: &str,
        labels: HashMap<String, String>,
        subnet: &str,
        ip_range: &str,
    ) -> EngineResult<()> {
        let docker = self.docker()?;
        let req = NetworkCreateRequest {
            name: name.to_string(),
            driver: Some("bridge".into()),
            internal: Some(true),
            options: Some(HashMap::from([(
                "com.docker.network.bridge.inhibit_ipv4".to_string(),
                "true".to_string(),
            )])),
            labels: Some(labels),
            ipam: Some(Ipam {
                config: Some(vec![IpamConfig {
                    subnet: Some(subnet.to_string()),
                    ip_range: Some(ip_range.to_string()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        match self
            .making(async move { docker.create_network(req).await })
            .await
        {
            Ok(_) => Ok(()),
            Err(EngineError::Failed(m)) if m.contains("overlap") => Err(EngineError::Conflict(m)),
            Err(other) => Err(other),
        }
    }

    /// Attaches a container to a network, under extra DNS `aliases` that
    /// resolve on that network only, at `address` if given; already
    /// attached is fine.
    pub async fn connect_network(
        &self,
        network: &str,
        container: &str,
        aliases: &[&str],
        address: Option<std::net::Ipv4Addr>,
    ) -> EngineResult<()> {
        let docker = self.docker()?;
        let req = NetworkConnectRequest {
            container: container.to_string(),
            endpoint_config: (!aliases.is_empty() || address.is_some()).then(|| {
                bollard::models::EndpointSettings {
                    aliases: Some(aliases.iter().map(|a| a.to_string()).collect())
                        .filter(|a: &Vec<String>| !a.is_empty()),
                    ipam_config: address.map(|a| bollard::models::EndpointIpamConfig {
                        ipv4_address: Some(a.to_string()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            }),
        };
        match docker.connect_network(network, req).await {
            Ok(()) => Ok(()),
            Err(e) => match EngineError::from(e) {
                EngineError::Failed(m) | EngineError::Conflict(m)
                    if m.contains("already exists") =>
                {
                    Ok(())
                }
                other => Err(other),
            },
        }
    }

    /// Detaches a container from a network; not attached (or either one
    /// missing) is fine.
    pub async fn disconnect_network(&self, network: &str, container: &str) -> EngineResult<()> {
        let docker = self.docker()?;
        let req = bollard::models::NetworkDisconnectRequest {
            container: container.to_string(),
            force: Some(true),
        };
        match docker.disconnect_network(network, req).await {
            Ok(()) => Ok(()),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(()),
                EngineError::Failed(m) | EngineError::Conflict(m)
                    if m.contains("not connected") =>
                {
                    Ok(())
                }
                other => Err(other),
            },
        }
    }

    /// Removes a network; a missing one is fine.
    pub async fn remove_network(&self, name: &str) -> EngineResult<()> {
        let docker = self.docker()?;
        match docker.remove_network(name).await {
            Ok(()) => Ok(()),
            Err(e) => match EngineError::from(e) {
                EngineError::NotFound(_) => Ok(()),
                other => Err(other),
            },
        }
    }

    /// Every network carrying all of `labels`.
    pub async fn list_networks(&self, labels: &[(&str, &str)]) -> EngineResult<Vec<NetworkRecord>> {
        let docker = self.docker()?;
        let list = docker
            .list_networks(Some(ListNetworksOptions {
                filters: Some(label_filter(labels)),
            }))
            .await?;
        Ok(list
            .into_iter()
            .map(|n| NetworkRecord {
                name: n.name.unwrap_or_default(),
                labels: n.labels.unwrap_or_default(),
                subnets: n
                    .ipam
                    .and_then(|i| i.config)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|c| c.subnet)
                    .collect(),
            })
            .collect())
    }
}
