"""A tiny OTLP/HTTP trace receiver for the end-to-end tests.

It decodes each POST /v1/traces body as an ExportTraceServiceRequest with the
`opentelemetry-proto` package and appends one JSON line per span to OUT: trace and span ids
in hex, parent, name, kind (the proto's enum name), times, attributes, links, status, and
the request's headers it was asked to record (the test checks OTEL_EXPORTER_OTLP_HEADERS
arrive). It writes its port to OUT + ".port" once listening. With DELAY (seconds), it waits
that long before it records and answers each request: a slow collector, behind which spans
queue in the exporter.

Usage: otlp_receiver.py OUT [DELAY]
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

OUT = sys.argv[1]
DELAY = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind is None:
        return None
    return getattr(v, kind)


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(404)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        time.sleep(DELAY)
        with open(OUT, "a") as out:
            for resource_spans in request.resource_spans:
                resource = {kv.key: value(kv.value) for kv in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        out.write(
                            json.dumps(
                                {
                                    "trace_id": span.trace_id.hex(),
                                    "span_id": span.span_id.hex(),
                                    "parent_span_id": span.parent_span_id.hex(),
                                    "name": span.name,
                                    "kind": Span.SpanKind.Name(span.kind),
                                    "start": span.start_time_unix_nano,
                                    "end": span.end_time_unix_nano,
                                    "attributes": {kv.key: value(kv.value) for kv in span.attributes},
                                    "links": [
                                        {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()}
                                        for link in span.links
                                    ],
                                    "status": Status.StatusCode.Name(span.status.code),
                                    "scope": scope_spans.scope.name,
                                    "service": resource.get("service.name"),
                                    "x_test_header": self.headers.get("x-test-header"),
                                }
                            )
                            + "\n"
                        )
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(OUT + ".port.tmp", "w") as port:
    port.write(str(server.server_address[1]))
import os  # noqa: E402

os.rename(OUT + ".port.tmp", OUT + ".port")
server.serve_forever()
