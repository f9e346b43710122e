# Sourced by the GPU scripts (workflow_gpu.sh, references_gpu.sh): the node's own MLflow
# tracking server, SQLite, on 127.0.0.1:5000, the server the `gpu-node` site uploads to.
#   start_mlflow_server DIR LOG [WAIT_S]
# starts it with its store (DIR/mlflow.db) and artifacts (DIR/artifacts), its output in LOG,
# sets SERVER to its pid and returns 0 once /health answers (1 after WAIT_S seconds, 120).
start_mlflow_server() {
  local dir=$1 log=$2 wait_s=${3:-120}
  mkdir -p "$dir"
  python3 -m mlflow server --backend-store-uri "sqlite:///$dir/mlflow.db" \
    --default-artifact-root "$dir/artifacts" --host 127.0.0.1 --port 5000 >"$log" 2>&1 &
  SERVER=$!
  for _ in $(seq "$wait_s"); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:5000/health', timeout=2)" \
      2>/dev/null && return 0
    sleep 1
  done
  return 1
}
