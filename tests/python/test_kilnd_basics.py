"""kilnd seen from a Python gRPC client, as the torch.compile backend will see it."""
import grpc

from kilnd_server import Kilnd, health_status


def test_serving_then_clean_exit_on_sigterm(kilnd):
    assert health_status(kilnd.address) == 1  # SERVING
    assert kilnd.stop() == 0
    assert "NOT_SERVING" in kilnd.log()


def test_garbage_request_is_invalid_argument_and_server_survives(kilnd):
    with grpc.insecure_channel(kilnd.address) as channel:
        compile_call = channel.unary_unary("/kiln.v1.Compiler/Compile")
        try:
            compile_call(b"\x0a\xff\xff\x01garbage", timeout=5)
            raise AssertionError("garbage was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            assert "not a valid kiln.v1.CompileRequest" in e.details()
    assert health_status(kilnd.address) == 1


def test_oversized_request_is_resource_exhausted():
    server = Kilnd("--max_receive_message_bytes=1024")
    try:
        with grpc.insecure_channel(server.address) as channel:
            try:
                channel.unary_unary("/kiln.v1.Compiler/Compile")(b"\x2a\x80\x10" + b"x" * 2048, timeout=5)
                raise AssertionError("an oversized request was accepted")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e
    finally:
        assert server.stop() == 0
