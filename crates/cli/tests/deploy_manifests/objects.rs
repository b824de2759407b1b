//! Reading Kubernetes objects parsed into JSON values: kinds, containers,
//! flags, environment, mounts and volumes.

use serde_json::Value;

pub fn string(value: &Value, pointer: &str) -> String {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

pub fn objects_of<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects
        .iter()
        .filter(|object| object["kind"] == kind)
        .collect()
}

pub fn single<'a>(objects: &'a [Value], kind: &str, origin: &str) -> &'a Value {
    let found = objects_of(objects, kind);
    assert_eq!(found.len(), 1, "{origin}: one {kind} expected");
    found[0]
}

pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects_of(objects, kind)
        .into_iter()
        .find(|object| object["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

pub fn workloads(objects: &[Value]) -> Vec<&Value> {
    objects
        .iter()
        .filter(|object| {
            ["Deployment", "DaemonSet", "StatefulSet", "Pod"]
                .contains(&object["kind"].as_str().unwrap_or(""))
        })
        .collect()
}

pub fn containers(workload: &Value) -> Vec<&Value> {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .map(|list| list.iter().collect())
        .unwrap_or_default()
}

pub fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    containers(workload)
        .into_iter()
        .find(|container| container["name"] == name)
        .unwrap_or_else(|| {
            panic!(
                "{} has no container {name}",
                string(workload, "/metadata/name")
            )
        })
}

/// A container's `--name=value` / `--name value` / `--name` arguments.
pub fn flags(container: &Value) -> Vec<(String, String)> {
    let arguments: Vec<String> = container["args"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|item| item.as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default();
    let mut parsed = Vec::new();
    let mut index = 0;
    while index < arguments.len() {
        let argument = &arguments[index];
        assert!(argument.starts_with("--"), "not a flag: {argument}");
        if let Some((name, value)) = argument.split_once('=') {
            parsed.push((name.to_string(), value.to_string()));
        } else if arguments
            .get(index + 1)
            .is_some_and(|next| !next.starts_with("--"))
        {
            parsed.push((argument.clone(), arguments[index + 1].clone()));
            index += 1;
        } else {
            parsed.push((argument.clone(), String::new()));
        }
        index += 1;
    }
    parsed
}

pub fn flag(container: &Value, name: &str) -> Option<String> {
    flags(container)
        .into_iter()
        .find(|(flag, _)| flag == name)
        .map(|(_, value)| value)
}

pub fn env_named<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|variable| variable["name"] == name)
}

/// A flag's value with `$(VARIABLE)` replaced as the kubelet does, from a
/// literal or a ConfigMap key.
pub fn resolve(objects: &[Value], container: &Value, value: &str) -> String {
    let Some(variable) = value
        .strip_prefix("$(")
        .and_then(|rest| rest.strip_suffix(')'))
    else {
        return value.to_string();
    };
    let env = env_named(container, variable)
        .unwrap_or_else(|| panic!("$({variable}) used but not in env"));
    if let Some(literal) = env["value"].as_str() {
        return literal.to_string();
    }
    let reference = &env["valueFrom"]["configMapKeyRef"];
    let map = find(objects, "ConfigMap", reference["name"].as_str().unwrap());
    map["data"][reference["key"].as_str().unwrap()]
        .as_str()
        .unwrap_or_else(|| panic!("ConfigMap has no key for $({variable})"))
        .to_string()
}

/// The volume mounted over `path` in a container (the deepest mount), and
/// the path below the mount point.
pub fn mount_for(container: &Value, path: &str) -> Option<(String, String)> {
    container["volumeMounts"]
        .as_array()?
        .iter()
        .filter_map(|mount| {
            let at = mount["mountPath"].as_str()?.trim_end_matches('/');
            let rest = path.strip_prefix(at)?.strip_prefix('/')?;
            Some((at.len(), string(mount, "/name"), rest.to_string()))
        })
        .max_by_key(|(depth, _, _)| *depth)
        .map(|(_, volume, rest)| (volume, rest))
}

pub fn mount_at<'a>(container: &'a Value, path: &str) -> Option<&'a Value> {
    container["volumeMounts"].as_array()?.iter().find(|mount| {
        mount["mountPath"]
            .as_str()
            .map(|at| at.trim_end_matches('/'))
            == Some(path)
    })
}

pub fn volume_named<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .and_then(|volumes| volumes.iter().find(|volume| volume["name"] == name))
        .unwrap_or_else(|| panic!("no volume {name}"))
}

pub fn host_path(workload: &Value, volume: &str) -> Option<String> {
    volume_named(workload, volume)["hostPath"]["path"]
        .as_str()
        .map(|path| path.trim_end_matches('/').to_string())
}
