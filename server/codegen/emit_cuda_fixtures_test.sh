#!/bin/bash
# emit_cuda_fixtures writes a cubin, the source and a manifest that names every kernel with its
# launch (the inputs of tests/gpu/cuda_kernels_check.py). Needs NVRTC (KILN_NVRTC_PATH); without
# it the test fails when KILN_REQUIRE_NVRTC=1 and is skipped loudly otherwise.
set -euo pipefail
bin="${TEST_SRCDIR}/${TEST_WORKSPACE}/server/codegen/emit_cuda_fixtures"
out="${TEST_TMPDIR}/fixtures"
if ! "${bin}" "${out}" --small > "${TEST_TMPDIR}/log" 2>&1; then
  cat "${TEST_TMPDIR}/log"
  if grep -q "NVRTC\|nvrtc" "${TEST_TMPDIR}/log" && [ "${KILN_REQUIRE_NVRTC:-0}" != "1" ]; then
    echo "*** NVRTC NOT FOUND: emit_cuda_fixtures_test is SKIPPED ***"
    exit 0
  fi
  exit 1
fi
cat "${TEST_TMPDIR}/log"
test "$(head -c 4 "${out}/kernels_sm_90.cubin" | od -An -c | tr -d ' ')" = "177ELF"
grep -q "namespace kiln_cuda" "${out}/kernels.cu"
for name in add_f32 bf16_chain broadcast_add_transposed softmax_1024 log_softmax_8192 softmax_16384 softmax_32768 \
            layer_norm_1024 column_sum softmax_bf16_1024 layer_norm_bf16_1024 rms_norm_1024 rms_norm_bf16_1024 \
            transpose_add_column_major softmax_bf16_50257 softmax_65536 softmax_bf16_65536 log_softmax_131072 \
            softmax_262144 log_softmax_262144 softmax_bf16_262144 layer_norm_bf16_50257 row_sum_64x262144 \
            row_sum_bf16_64x262144 full_sum_64m full_sum_64m_partials full_sum_64m_combine softmax_50257 cat_transposed_bf16 column_sum_3_rows; do
  grep -q "\"name\": \"${name}\"" "${out}/manifest.json" || { echo "no ${name} in the manifest"; exit 1; }
done
python3 -c "import json,sys; m=json.load(open(sys.argv[1])); assert len(m['kernels'])==54; assert all(k['grid']>=1 and k['block']>=32 for k in m['kernels'])" "${out}/manifest.json"
# The cat with a transposed operand stages it through a shared tile.
python3 -c "import json,sys; m={k['name']: k for k in json.load(open(sys.argv[1]))['kernels']}; assert m['cat_transposed_bf16']['layout']=='tiled', m['cat_transposed_bf16']" "${out}/manifest.json"
# Odd rows (50257) move in 8-wide bf16 vectors shifted to each row's alignment.
python3 -c "import json,sys; m={k['name']: k for k in json.load(open(sys.argv[1]))['kernels']}; assert m['softmax_bf16_50257']['vector_width']==8 and m['softmax_50257']['vector_width']==4 and m['layer_norm_bf16_50257']['vector_width']==8, m['softmax_bf16_50257']" "${out}/manifest.json"
# sm_90: few long rows (1 MB rows do not fit the L2 test) spread over thread-block clusters (grid a multiple of the cluster); the
# _l2 and _cl fixtures force one uncached block per row and a cluster (by default long rows take
# clusters: the uncached block lost on the H200, cuda_long_rows.h).
python3 -c "import json,sys; m={k['name']: k for k in json.load(open(sys.argv[1]))['kernels']}; assert all(m[n]['layout']=='cluster_row' and m[n]['grid'] % m[n]['cluster']==0 for n in ('softmax_262144','row_sum_64x262144','softmax_bf16_50257_cl','layer_norm_bf16_50257_cl')), m['softmax_262144']" "${out}/manifest.json"
python3 -c "import json,sys; m={k['name']: k for k in json.load(open(sys.argv[1]))['kernels']}; assert all(m[n]['layout']=='block_per_row' and m[n]['cluster']==1 and m[n]['cached_values']==0 for n in ('softmax_bf16_50257_l2','softmax_50257_l2','softmax_bf16_262144_l2','layer_norm_bf16_50257_l2')), m['softmax_50257_l2']" "${out}/manifest.json"
# _sm: one block per row caching it in dynamic shared memory (> 48 KiB: the opt-in attribute), for
# the shapes whose cache fits a block; the others have none.
python3 -c "import json,sys; m={k['name']: k for k in json.load(open(sys.argv[1]))['kernels']}; sm=[n for n in m if n.endswith('_sm')]; assert sorted(sm)==['layer_norm_bf16_50257_sm','softmax_50257_sm','softmax_bf16_50257_sm','softmax_bf16_65536_sm'], sm; assert all(m[n]['layout']=='shared_row' and m[n]['shared_bytes']>48*1024 and m[n]['cluster']==1 for n in sm), [m[n] for n in sm]; assert m['softmax_bf16_50257_sm']['shared_bytes']==106496; assert all(k['shared_bytes']==0 for n,k in m.items() if k['layout']!='shared_row')" "${out}/manifest.json"
# _smp: two caches and their two mbarriers in one block (kSharedPrefetch), where both fit: the
# bf16 50257 rows; the plain bf16 50257 softmax takes them by default, the layer norm keeps one.
python3 -c "import json,sys; m={k['name']: k for k in json.load(open(sys.argv[1]))['kernels']}; smp=sorted(n for n in m if n.endswith('_smp')); assert smp==['layer_norm_bf16_50257_smp','softmax_bf16_50257_smp'], smp; assert all(m[n]['layout']=='shared_row' and m[n]['shared_bytes']==2*106496+16 for n in smp), [m[n] for n in smp]; assert m['softmax_bf16_50257']['shared_bytes']==2*106496+16; assert m['layer_norm_bf16_50257']['shared_bytes']==106496" "${out}/manifest.json"
echo PASS
