# Stages of a CI run, sourced by .ci/run: where the time goes, and what failed first.
#
#   stage NAME CMD...   runs CMD in the foreground; its output goes to the terminal and to
#                       its log; prints a line with the clock and the run's minutes at its
#                       start and at its end; a failure does not stop the run (the table
#                       says it failed; ok NAME tells the stages that need it)
#   must NAME CMD...    the same, and a failure ends the run (what everything else needs)
#   job NAME CMD...     starts CMD in the background, beside the stages; its output goes to
#                       its log only
#   await NAME          waits for that job, prints its log whole, and records it as a stage
#   ok NAME             whether that stage or job passed
#   skip NAME WHY       records a stage not run, because a stage it needs failed
#   summary             one table (stage, start, minutes, result), the first failure's log
#                       tail, and exit 1 if anything failed
#
# Logs: $CI_LOGS (.ci/logs), one file per stage, numbered in the order the stages began.

CI_LOGS=${CI_LOGS:-$PWD/.ci/logs}
CI_T0=$(date +%s)
rm -rf "$CI_LOGS"
mkdir -p "$CI_LOGS"

declare -a _NAMES=()
declare -A _BEGAN=() _ENDED=() _RESULT=() _LOG=() _PID=()

_now() { date +%s; }
_min() { awk -v s="$1" 'BEGIN { printf "%.1f", s / 60 }'; }
_at() { printf '%s, minute %s' "$(date +%H:%M:%S)" "$(_min $(($(_now) - CI_T0)))"; }

_open() {  # _open NAME: number the stage and name its log
  local name=$1 slug
  _NAMES+=("$name")
  slug=$(printf '%02d-%s' "${#_NAMES[@]}" "$name" | tr -c 'A-Za-z0-9.\n-' '-')
  _LOG[$name]=$CI_LOGS/$slug.log
  _BEGAN[$name]=$(_now)
}

_close() {  # _close NAME CODE [ENDED]
  local name=$1 code=$2
  _ENDED[$name]=${3:-$(_now)}
  if ((code == 0)); then _RESULT[$name]=passed; else _RESULT[$name]="FAILED (exit $code)"; fi
  printf '\n== [%s] end: %s, %s min: %s\n' "$(_at)" "$name" \
    "$(_min $((_ENDED[$name] - _BEGAN[$name])))" "${_RESULT[$name]}"
}

stage() {
  local name=$1 code=0; shift
  _open "$name"
  printf '\n== [%s] start: %s\n' "$(_at)" "$name"
  # In the background and waited for: a command in an if, || or && runs without errexit
  # (bash ignores set -e there), and a stage must stop at its first failing step.
  { ("$@") 2>&1 | tee "${_LOG[$name]}"; exit "${PIPESTATUS[0]}"; } &
  wait "$!" || code=$?
  _close "$name" "$code"
}

must() {
  stage "$@"
  ok "$1" && return 0
  printf '\n%s is needed by everything after it: the run stops here.\n' "$1"
  summary
}

job() {
  local name=$1; shift
  _open "$name"
  printf '\n== [%s] start, beside the others: %s (log: %s)\n' "$(_at)" "$name" "${_LOG[$name]}"
  (
    code=0
    ("$@") &  # waited for, not tested with ||: errexit stays on in the command (see stage)
    wait "$!" || code=$?
    _now >"${_LOG[$name]}.ended"
    exit "$code"
  ) >"${_LOG[$name]}" 2>&1 &
  _PID[$name]=$!
}

await() {
  local name=$1 code=0
  wait "${_PID[$name]}" || code=$?
  printf '\n== [%s] output of %s (ran beside the others from minute %s)\n' "$(_at)" "$name" \
    "$(_min $((_BEGAN[$name] - CI_T0)))"
  cat "${_LOG[$name]}"
  _close "$name" "$code" "$(cat "${_LOG[$name]}.ended" 2>/dev/null || _now)"
}

ok() { [[ ${_RESULT[$1]:-} == passed ]]; }

skip() {
  _open "$1"
  _ENDED[$1]=${_BEGAN[$1]}
  _RESULT[$1]="not run: $2"
  printf '\n== [%s] not run: %s (%s)\n' "$(_at)" "$1" "$2"
}

_tests() {  # what each pytest run of a stage said at its end ("2050 passed + 3 failed, ...")
  [[ -f ${_LOG[$1]} ]] || return 0
  grep -aoE '([0-9]+ (passed|failed|skipped|deselected|errors?|xfailed|xpassed|warnings?)(, )?)+ in [0-9.]+s' \
    "${_LOG[$1]}" | sed -E 's/ in [0-9.]+s$//' | paste -sd '+' | sed 's/+/ + /g'
}

summary() {
  local name pid first="" total=$(($(_now) - CI_T0))
  for name in "${!_PID[@]}"; do  # jobs never awaited (the run stopped early)
    pid=${_PID[$name]}
    if [[ -z ${_RESULT[$name]:-} ]]; then
      kill -- "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
      _ENDED[$name]=$(_now) _RESULT[$name]="stopped: the run ended first"
    fi
  done
  local width=5
  for name in "${_NAMES[@]}"; do ((${#name} > width)) && width=${#name}; done
  printf '\n== [%s] the stages (minutes since the start; side by side where they overlap)\n\n' "$(_at)"
  printf "| %-${width}s | start |   end | minutes | result | tests |\n" stage
  printf '|%s|------:|------:|--------:|--------|-------|\n' "$(printf -- '-%.0s' $(seq $((width + 2))))"
  for name in "${_NAMES[@]}"; do
    printf "| %-${width}s | %5s | %5s | %7s | %s | %s |\n" "$name" "$(_min $((_BEGAN[$name] - CI_T0)))" \
      "$(_min $((_ENDED[$name] - CI_T0)))" "$(_min $((_ENDED[$name] - _BEGAN[$name])))" \
      "${_RESULT[$name]}" "$(_tests "$name")"
    [[ -n $first || ${_RESULT[$name]} == passed || ${_RESULT[$name]} == not\ run* ]] || first=$name
  done
  printf '\nthe whole run: %s min; logs: %s\n' "$(_min "$total")" "$CI_LOGS"
  if [[ -n $first ]]; then
    printf '\n== the first failure: %s; the end of its log (%s):\n\n' "$first" "${_LOG[$first]}"
    tail -n 80 "${_LOG[$first]}"
    exit 1
  fi
  exit 0
}
