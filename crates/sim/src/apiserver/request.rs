//! Request paths to routes, as the real API server lays them out.

use super::resources::{self, ResId};

/// Where a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `/version`
    Version,
    /// `/healthz`, `/livez`, `/readyz` and their sub-checks.
    Health,
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/{group}`
    Group(String),
    /// `/api/v1`, `/apis/{group}/{version}`
    ResourceList {
        /// API group.
        group: String,
        /// API version.
        version: String,
    },
    /// `/openapi/v2`, `/openapi/v3[/...]`
    OpenApi(String),
    /// A resource path.
    Resource(ResourceRoute),
    /// Nothing is served here.
    NotFound,
}

/// A path naming a resource, an object or a subresource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceRoute {
    /// Which resource.
    pub res: ResId,
    /// The namespace in the path, if any.
    pub namespace: Option<String>,
    /// The object name, if any.
    pub name: Option<String>,
    /// The subresource, if any.
    pub subresource: Option<String>,
    /// What follows the subresource (`proxy` paths).
    pub rest: String,
    /// The deprecated `/watch/` prefix was used.
    pub watch_prefix: bool,
}

/// Routes a path.
pub fn route(path: &str) -> Route {
    let trimmed = path.trim_end_matches('/');
    let segments: Vec<&str> = trimmed.split('/').skip(1).collect();
    match segments.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "livez" | "readyz", ..] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["apis"] => Route::Groups,
        ["apis", group] => Route::Group((*group).to_owned()),
        ["openapi", ..] => Route::OpenApi(trimmed.to_owned()),
        ["api", "v1"] => Route::ResourceList {
            group: String::new(),
            version: "v1".into(),
        },
        ["apis", group, version] => Route::ResourceList {
            group: (*group).to_owned(),
            version: (*version).to_owned(),
        },
        ["api", "v1", rest @ ..] => resource_route("", "v1", rest),
        ["apis", group, version, rest @ ..] => resource_route(group, version, rest),
        _ => Route::NotFound,
    }
}

fn resource_route(group: &str, version: &str, segments: &[&str]) -> Route {
    let (watch_prefix, segments) = match segments {
        ["watch", rest @ ..] => (true, rest),
        _ => (false, segments),
    };
    let namespaces = resources::find(group, version, "namespaces");
    let (namespace, rest): (Option<&str>, &[&str]) = match segments {
        // `namespaces/{ns}` and `namespaces/{ns}/status|finalize` are the Namespace object.
        ["namespaces", _] | ["namespaces", _, "status" | "finalize"] if namespaces.is_some() => {
            (None, segments)
        }
        ["namespaces", ns, rest @ ..] => (Some(*ns), rest),
        _ => (None, segments),
    };
    let [plural, tail @ ..] = rest else {
        return Route::NotFound;
    };
    let Some(res) = resources::find(group, version, plural) else {
        return Route::NotFound;
    };
    let rt = resources::get(res);
    if namespace.is_some() && !rt.namespaced {
        return Route::NotFound;
    }
    let name = tail.first().map(|s| (*s).to_owned());
    let subresource = tail.get(1).map(|s| (*s).to_owned());
    if let Some(sub) = &subresource
        && !rt.subresources.iter().any(|(s, _)| s == sub)
    {
        return Route::NotFound;
    }
    Route::Resource(ResourceRoute {
        res,
        namespace: namespace.map(str::to_owned),
        name,
        subresource,
        rest: tail.get(2..).map(|r| r.join("/")).unwrap_or_default(),
        watch_prefix,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::ids;

    fn res(path: &str) -> ResourceRoute {
        match route(path) {
            Route::Resource(r) => r,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn resource_paths() {
        let r = res("/api/v1/namespaces/shop/pods/web/status");
        assert_eq!(
            (
                r.res,
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.subresource.as_deref()
            ),
            (*ids::PODS, Some("shop"), Some("web"), Some("status"))
        );
        let r = res("/api/v1/pods");
        assert_eq!((r.namespace, r.name), (None, None));
        let r = res("/api/v1/namespaces/shop");
        assert_eq!((r.res, r.name.as_deref()), (*ids::NAMESPACES, Some("shop")));
        let r = res("/api/v1/namespaces/shop/finalize");
        assert_eq!(
            (r.res, r.subresource.as_deref()),
            (*ids::NAMESPACES, Some("finalize"))
        );
        let r = res("/apis/apps/v1/namespaces/a/deployments");
        assert_eq!(r.res, *ids::DEPLOYMENTS);
        let r = res("/api/v1/watch/namespaces/a/pods");
        assert!(r.watch_prefix);
        let r = res("/api/v1/nodes/n1/proxy/stats/summary");
        assert_eq!(
            (r.subresource.as_deref(), r.rest.as_str()),
            (Some("proxy"), "stats/summary")
        );
        let r = res("/api/v1/namespaces/a/pods/p/proxy");
        assert_eq!(r.rest, "");
    }

    #[test]
    fn meta_paths_and_misses() {
        assert_eq!(route("/version"), Route::Version);
        assert_eq!(route("/readyz/ping"), Route::Health);
        assert_eq!(route("/apis/apps"), Route::Group("apps".into()));
        assert_eq!(
            route("/apis/apps/v1/"),
            Route::ResourceList {
                group: "apps".into(),
                version: "v1".into()
            }
        );
        assert_eq!(route("/api/v1/widgets"), Route::NotFound);
        assert_eq!(
            route("/api/v1/namespaces/a/nodes"),
            Route::NotFound,
            "cluster-scoped"
        );
        assert_eq!(route("/api/v1/namespaces/a/pods/p/bogus"), Route::NotFound);
        assert_eq!(route("/nope"), Route::NotFound);
    }
}
