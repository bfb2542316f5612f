//! An interactive command (`cube exec -it`) once its connection is upgraded: the user's
//! input, terminal sizes and end of input go to the command; its output, then its exit code,
//! come back, as frames (`cube_api::attach`). It ends when the command's output ends, the
//! connection does, or the worker stops.

use std::sync::Arc;

use cube_api::attach::{Frame, read_frame, write_frame};
use cube_runtime::{ExecSession, Runtime};
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::worker::Worker;

pub(crate) async fn serve<R, Io>(worker: Arc<Worker<R>>, session: ExecSession, tty: bool, io: Io)
where
    R: Runtime,
    Io: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut from_user, mut to_user) = tokio::io::split(io);
    let ExecSession {
        exec_id,
        mut output,
        mut input,
    } = session;
    // The user's side: frames in, to the command's input, until the connection ends.
    let resizer = worker.clone();
    let resize_id = exec_id.clone();
    let inbound = async move {
        loop {
            match read_frame(&mut from_user).await {
                Ok(Some(Frame::Input(bytes))) => {
                    if input.write_all(&bytes).await.is_err() || input.flush().await.is_err() {
                        return;
                    }
                }
                Ok(Some(Frame::Resize { width, height })) => {
                    resizer.resize_exec(&resize_id, width, height).await;
                }
                // With a terminal, the end of input is the terminal's end-of-file character
                // (closing the engine's connection would cut the output short); without
                // one, the input is closed.
                Ok(Some(Frame::InputClosed)) if tty => {
                    let _ = input.write_all(&[0x04]).await;
                    let _ = input.flush().await;
                }
                Ok(Some(Frame::InputClosed)) => {
                    let _ = input.shutdown().await;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return,
            }
        }
    };
    // The command's side: its output out, then its exit code.
    let outbound = async {
        while let Some(chunk) = output.next().await {
            let frame = match chunk {
                Ok(chunk) => Frame::Output(chunk.data.to_vec()),
                Err(err) => Frame::Error(err.to_string()),
            };
            if write_frame(&mut to_user, &frame).await.is_err() {
                return;
            }
        }
        let code = worker.exec_exit_code(&exec_id).await;
        let _ = write_frame(&mut to_user, &Frame::Exit(code)).await;
        let _ = to_user.shutdown().await;
    };
    let closing = worker.closing().clone();
    tokio::pin!(inbound);
    tokio::select! {
        _ = closing.cancelled() => {}
        () = outbound => {}
        // The user went away: the command keeps what it was given; nothing more is read.
        () = &mut inbound => {}
    }
}
