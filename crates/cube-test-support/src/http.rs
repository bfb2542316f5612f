//! A loopback HTTP/1.1 server that counts its open connections: how a test sees what a
//! client keeps open.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A loopback HTTP/1.1 server answering `{}` after `delay` to each small request (one read,
/// one request), keeping connections alive; its address (`127.0.0.1:PORT`) and how many
/// connections are open now. Runs on the caller's runtime until it ends.
pub async fn counting_server(delay: Duration) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = listener
        .local_addr()
        .expect("the listener's address")
        .to_string();
    let open = Arc::new(AtomicUsize::new(0));
    let counted = open.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let open = counted.clone();
            open.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 4096];
                loop {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            tokio::time::sleep(delay).await;
                            let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                            if stream.write_all(answer.as_bytes()).await.is_err() {
                                break;
                            }
                        }
                    }
                }
                open.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (address, open)
}

/// Waits up to 5 s for `open` to read `expected`; what it reads last.
pub async fn open_settles_at(open: &AtomicUsize, expected: usize) -> usize {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while open.load(Ordering::SeqCst) != expected && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    open.load(Ordering::SeqCst)
}
