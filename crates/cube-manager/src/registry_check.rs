//! `cube registry login`'s check: does the registry take this username and password? Asked
//! of the registry's `GET /v2/` (the Docker registry API's base), with basic auth, or through
//! its token service when it answers with a bearer challenge (Docker Hub's way). HTTPS first;
//! a registry on loopback is also tried over plain HTTP, as the Docker engine allows there.

use std::time::Duration;

/// How long the registry has to answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// `Ok(None)`: the registry took the login. `Ok(Some(note))`: it could not be asked (the note
/// says why; the login is kept unverified). `Err(why)`: the registry refused it.
pub async fn check(host: &str, username: &str, password: &str) -> Result<Option<String>, String> {
    cube_api::tls::provider();
    let client = match reqwest::Client::builder().timeout(CHECK_TIMEOUT).build() {
        Ok(client) => client,
        Err(err) => return Ok(Some(format!("not verified: no HTTP client: {err}"))),
    };
    let loopback = {
        let bare = host.rsplit_once(':').map_or(host, |(bare, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                bare
            } else {
                host
            }
        });
        bare == "localhost" || bare.starts_with("127.") || bare == "[::1]"
    };
    let mut schemes = vec!["https"];
    if loopback {
        schemes.push("http");
    }
    let mut unreached = Vec::new();
    for scheme in schemes {
        let url = format!("{scheme}://{host}/v2/");
        let answer = match client
            .get(&url)
            .basic_auth(username, Some(password))
            .send()
            .await
        {
            Ok(answer) => answer,
            Err(err) => {
                unreached.push(format!("{url}: {}", cube_api::error_chain(&err)));
                continue;
            }
        };
        let status = answer.status().as_u16();
        if answer.status().is_success() {
            return Ok(None);
        }
        if status == 401 {
            let challenge = answer
                .headers()
                .get("www-authenticate")
                .and_then(|value| value.to_str().ok())
                .unwrap_or("")
                .to_string();
            if let Some(bearer) = challenge.strip_prefix("Bearer ") {
                return token_check(&client, bearer, username, password, host).await;
            }
            return Err(format!(
                "unauthorized: the registry {host} refused the password of {username:?}"
            ));
        }
        return Ok(Some(format!(
            "not verified: {url} answered {status}, not 200 or 401"
        )));
    }
    Ok(Some(format!(
        "not verified: the registry could not be reached from the manager ({})",
        unreached.join("; ")
    )))
}

/// A bearer challenge's token service, asked with the login.
async fn token_check(
    client: &reqwest::Client,
    challenge: &str,
    username: &str,
    password: &str,
    host: &str,
) -> Result<Option<String>, String> {
    let field = |name: &str| {
        challenge.split(',').find_map(|part| {
            let (key, value) = part.trim().split_once('=')?;
            (key == name).then(|| value.trim_matches('"').to_string())
        })
    };
    let Some(realm) = field("realm") else {
        return Ok(Some(format!(
            "not verified: {host}'s challenge names no token service"
        )));
    };
    let url = match field("service") {
        Some(service) => {
            let encoded: String = service
                .bytes()
                .map(|byte| {
                    if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
                        (byte as char).to_string()
                    } else {
                        format!("%{byte:02X}")
                    }
                })
                .collect();
            let joint = if realm.contains('?') { '&' } else { '?' };
            format!("{realm}{joint}service={encoded}")
        }
        None => realm.clone(),
    };
    let request = client.get(&url).basic_auth(username, Some(password));
    match request.send().await {
        Ok(answer) if answer.status().is_success() => Ok(None),
        Ok(answer) if answer.status().as_u16() == 401 => Err(format!(
            "unauthorized: the registry {host} refused the password of {username:?}"
        )),
        Ok(answer) => Ok(Some(format!(
            "not verified: {realm} answered {}",
            answer.status().as_u16()
        ))),
        Err(err) => Ok(Some(format!(
            "not verified: {realm}: {}",
            cube_api::error_chain(&err)
        ))),
    }
}
