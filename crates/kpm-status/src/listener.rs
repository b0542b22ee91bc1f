//! The accept path of the transport for kpm's HTTP/1 servers (the status
//! API and metrics), as axum's `Listener`: every connection holds a permit
//! of the fd budget and its requests are tracked, so that only idle ones
//! are shed when the budget runs short.

use std::convert::Infallible;

use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::serve::IncomingStream;
use kpm::transport::fd::Activity;
use kpm::transport::{Http1Connection, Http1Incoming, Listen, TrackRequests};

/// An [`Http1Incoming`] for `axum::serve`.
#[derive(Debug)]
pub(crate) struct HttpListener<L: Listen> {
    incoming: Http1Incoming<L>,
}

impl<L: Listen> HttpListener<L> {
    pub(crate) fn new(incoming: Http1Incoming<L>) -> Self {
        Self { incoming }
    }
}

impl<L: Listen> axum::serve::Listener for HttpListener<L> {
    type Io = Http1Connection<L::Io>;
    type Addr = ();

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.incoming.accept().await {
                Ok(connection) => return (connection, ()),
                // Shortages and clients that gave up never come here.
                Err(err) => {
                    tracing::warn!(listener = self.incoming.name(), error = %err, "cannot accept a connection");
                    tokio::time::sleep(kpm::transport::fd::SHORTAGE_PAUSE).await;
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(())
    }
}

/// The connection a request came on, for [`TrackRequests`].
#[derive(Debug, Clone)]
struct Connection(Activity);

impl<L: Listen> Connected<IncomingStream<'_, HttpListener<L>>> for Connection {
    fn connect_info(stream: IncomingStream<'_, HttpListener<L>>) -> Self {
        Self(stream.io().activity().clone())
    }
}

/// Serves `router` on `listener`, each request tracked on its connection.
pub(crate) async fn serve<L: Listen>(
    listener: HttpListener<L>,
    router: axum::Router,
) -> std::io::Result<()> {
    let router = router.layer(TrackRequests).layer(axum::middleware::map_request(
        |ConnectInfo(Connection(activity)): ConnectInfo<Connection>,
         mut request: axum::extract::Request| async move {
            request.extensions_mut().insert(activity);
            Ok::<_, Infallible>(request)
        },
    ));
    axum::serve(listener, router.into_make_service_with_connect_info::<Connection>()).await
}
