#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# urdma's wire formats as Wireshark sees them: RC, UC and XRC over TCP as
# iWARP, UD over UDP as RoCEv2 (decode_ud below: ibv_ud_pingpong, ib_send_lat
# -c UD, and mckey's multicast at the end).  For each
# workload (ibv_rc_pingpong -g N, ib_write_bw, ib_read_bw, ib_send_bw,
# ib_read_bw -b with 1 MiB Reads both ways, whose Read Responses fill the
# sockets so that non-blocking writes cut FPDUs and finish them later, UC's
# ibv_uc_pingpong and XRC's ib_send_bw -c XRC, whose Sends carry the SRQ
# number in DDP's field reserved for the ULP; server
# in namespace A, client in namespace B, URDMA_TRANSPORT=tcp), tshark captures
# the TCP traffic on the veth in B (without the programs' own out-of-band port)
# and decodes it with the MPA (iwarp_mpa) and DDP/RDMAP (iwarp_ddp_rdmap)
# dissectors.  A workload passes when both programs pass and the capture has:
#   (a) an MPA Request and Reply per connection, MPA FPDUs, and the RDMAP
#       messages of the workload (Send / RDMA Write / Read Request + Response);
#   (b) no malformed packet or expert warning/error from the iWARP dissectors
#       (TCP's own -- window full, zero window, D-SACK, retransmitted data,
#       reset -- are TCP at work, not our format: listed, not counted), no bad
#       MPA CRC, no TCP payload outside a decoded MPA frame;
#   (c) no packet dropped by the capture (dumpcap's count).
# tshark runs with two additions, each checked first on a capture made with
# text2pcap (the "wire decoder" cases):
#   - wire_check.lua works around a limit of Wireshark's MPA dissector: fewer
#     than 8 bytes of an FPDU at the end of a TCP segment, right after an FPDU
#     reassembled from earlier segments, were dropped from reassembly and every
#     later FPDU of the stream was framed wrongly: bad CRCs on a correct stream
#     in about 1 run in 10 (ib_write_bw, whose 64 KiB TSO segments end at any
#     4-byte offset of the stream);
#   - out-of-order reassembly: a segment lost on its way into B is captured
#     after the one that follows it.
# Usage: wire_check.sh BUILD_DIR     (exit 0 pass, 1 fail, 77 skip: not root)
COMPAT_BUDGET=${COMPAT_BUDGET:-200}   # seconds, for all cases
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../compat/common.sh
. "$HERE/../compat/common.sh"
# shellcheck source-path=SCRIPTDIR source=netns.sh
. "$HERE/netns.sh"
compat_init "${1:-}"
need_cmd ibv_rc_pingpong ibverbs-utils
need_cmd ib_write_bw perftest
need_cmd mckey rdmacm-utils
if ! command -v tshark >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v debconf-set-selections >/dev/null 2>&1; then
    # Keep the install non-interactive (and dumpcap not setuid).
    echo 'wireshark-common wireshark-common/install-setuid boolean false' | debconf-set-selections
fi
need_cmd tshark tshark
netns_setup_or_skip
net_hosts || exit 1
PAIR_NETNS=$SRV_NS

PORT_BASE=${NET_WIRE_PORT:-18900}
T=${NET_WIRE_TIMEOUT:-40}    # per process, seconds
DEV=${COMPAT_DEVICE:-urdma0}

# MPA has no port of its own: its heuristic dissector claims a TCP stream that
# starts with an MPA Request.  Heuristics first, so a kernel-chosen port that
# Wireshark knows for another protocol does not hide the stream.  RPC-over-RDMA
# and SMB Direct would try to decode Send payloads: not ours.  One pass: in a
# second one the MPA dissector does not repeat the expert infos of an MPA
# Request.  UNDECODED needs two (-2), so tcp.reassembled_in is known; a
# retransmission (or out-of-order segment: the same, seen late) repeats bytes
# already decoded.  Out-of-order segments are put back in order before
# reassembly: a segment lost on the way into VETH_B's namespace is missing
# from the capture until its retransmission.
TSHARK_IWARP=(-o tcp.try_heuristic_first:TRUE -o tcp.reassemble_out_of_order:TRUE
              --enable-heuristic iwarp_mpa_tcp
              --disable-protocol rpcordma --disable-protocol smb_direct
              -X "lua_script:$HERE/wire_check.lua")
UNDECODED='tcp.len > 0 && !iwarp_mpa && !tcp.reassembled_in && !tcp.analysis.out_of_order
           && !tcp.analysis.retransmission && !tcp.analysis.spurious_retransmission'

CAP_PID=""
# capture_start NAME OOB_PORT [FILTER]: capture on VETH_B (TCP but the
# out-of-band port, or FILTER); sets CAP_FILE, CAP_LOG.
# tshark says "Capturing on" before dumpcap has opened the interface: a
# workload started then may lose its MPA Request and Reply to the capture
# (seen once, on a machine's first run), and Wireshark does not decode a
# stream whose start it has not seen.  So a probe (a connection refused on
# port 9: a SYN and a reset, no payload) goes in until the capture file
# grows: dumpcap writes the file once it captures, after its filter is set.
capture_start() {
    CAP_FILE=$WORK/$1.pcapng
    CAP_LOG=$WORK/$1.tshark.log
    : >"$CAP_LOG"
    ip netns exec "$NS_B" timeout -k 2 $((T * 2)) \
        tshark -n -i "$VETH_B" -B 64 -f "${3:-tcp and not port $2}" -w "$CAP_FILE" >"$CAP_LOG" 2>&1 &
    CAP_PID=$!
    COMPAT_BG_PIDS+=("$CAP_PID")
    local i=0
    until grep -q '^Capturing on' "$CAP_LOG"; do
        if ! kill -0 "$CAP_PID" 2>/dev/null || [ "$i" -ge 200 ]; then
            show_log "$CAP_LOG" "tshark"
            return 1
        fi
        sleep 0.05
        i=$((i + 1))
    done
    local size0=-1 size
    i=0
    while :; do
        size=$(stat -c %s "$CAP_FILE" 2>/dev/null || echo -1)
        [ "$size0" -ge 0 ] && [ "$size" -gt "$size0" ] && return 0
        [ "$size0" -lt 0 ] && size0=$size
        if ! kill -0 "$CAP_PID" 2>/dev/null || [ "$i" -ge 100 ]; then
            show_log "$CAP_LOG" "tshark"
            return 1
        fi
        ip netns exec "$NS_B" timeout 1 bash -c "exec 3<>/dev/tcp/$SRV_IP/9" 2>/dev/null
        sleep 0.1
        i=$((i + 1))
    done
}

capture_stop() {
    sleep 1    # dumpcap reads the kernel buffer in batches (every 250 ms)
    kill -TERM "$CAP_PID" 2>/dev/null
    wait "$CAP_PID"
}

# decoder_case NAME SEGMENT...: what tshark makes of a capture made with
# text2pcap: an MPA Request and Reply (no CRC), then four RDMA Writes of 16
# bytes at TO 0, 16, 32, 48 (FPDUs of 36 bytes, ULPDU length 30), their 144
# bytes cut into the TCP segments SEGMENT "FROM:LEN@T" (LEN empty: to the
# end; T: the second at which the capture sees it, 3 to 9).  Passes when
# tshark finds the four Writes.
decoder_case() {
    local name="wire decoder: $1" file=$WORK/decoder$((++DECODER_CASES)) got want words b i seg from len t
    shift
    want="30 30 30 30 0x0000000000000000 0x0000000000000010 0x0000000000000020 0x0000000000000030"
    words=()
    for b in 00 10 20 30; do
        words+=(00 1e c1 40 00 00 01 00 00 00 00 00 00 00 00 "$b")
        for i in $(seq 16); do words+=("$b"); done
        words+=(00 00 00 00)
    done
    {
        printf 'O 00:00:01. 0000 %s 00 01 00 00\n\n' "$(printf 'MPA ID Req Frame' | od -An -tx1 -v | tr -s ' \n' ' ')"
        printf 'I 00:00:02. 0000 %s 00 01 00 00\n\n' "$(printf 'MPA ID Rep Frame' | od -An -tx1 -v | tr -s ' \n' ' ')"
        for seg in "$@"; do
            IFS=':@' read -r from len t <<<"$seg"
            printf 'O 00:00:0%s. 0000 %s\n\n' "$t" "${words[*]:$from:${len:-${#words[@]}}}"
        done
    } >"$file.txt"
    # text2pcap numbers the bytes in the order of the file, reordercap puts
    # the frames in the order of their times.
    if ! { text2pcap -q -D -t '%H:%M:%S.' -4 10.0.0.1,10.0.0.2 -T 40000,50000 "$file.txt" "$file.0.pcap" &&
           reordercap "$file.0.pcap" "$file.pcap"; } >"$file.log" 2>&1; then
        fail "$name" "text2pcap or reordercap failed"
        show_log "$file.log" "text2pcap, reordercap"
        return
    fi
    got=$(tshark -r "$file.pcap" "${TSHARK_IWARP[@]}" -Y iwarp_mpa -T fields -E occurrence=a \
              -E aggregator=' ' -e iwarp_mpa.ulpdulength -e iwarp_ddp.tagged_offset 2>"$file.err" |
          awk -F'\t' '$1 != "" { l = l " " $1; t = t " " $2 } END { print substr(l t, 2) }')
    if [ "$got" = "$want" ]; then
        pass "$name"
    else
        fail "$name" "ULPDU lengths and TOs: got '$got', want '$want'"
        show_log "$file.err" "tshark's errors"
    fi
}
DECODER_CASES=0

# iwarp_counts FILE: "req rep fpdus write readreq readresp send terminate other"
iwarp_counts() {
    tshark -r "$1" "${TSHARK_IWARP[@]}" -Y iwarp_mpa -T fields -E occurrence=a -E aggregator=, \
        -e iwarp_mpa.key.req -e iwarp_mpa.key.rep -e iwarp_mpa.ulpdulength -e iwarp_rdma.opcode 2>/dev/null |
    awk -F'\t' '
        function n(s) { return s == "" ? 0 : split(s, _, ",") }
        { req += n($1); rep += n($2); fpdu += n($3)
          k = split($4, op, ",")
          for (i = 1; i <= k; i++) {
              o = op[i] + 0
              if (o == 0) w++; else if (o == 1) rr++; else if (o == 2) rs++
              else if (o >= 3 && o <= 6) s++; else if (o == 7) t++; else other++
          } }
        END { print req + 0, rep + 0, fpdu + 0, w + 0, rr + 0, rs + 0, s + 0, t + 0, other + 0 }'
}

# expert_rows FILE: the expert infos at Warning and above, one per line:
# "PROTOCOL GROUP COUNT SUMMARY".
expert_rows() {
    tshark -r "$1" "${TSHARK_IWARP[@]}" -q -z expert,warn 2>/dev/null |
        awk '$1 ~ /^[0-9]+$/ && NF >= 4 { n = $1; g = $2; p = $3; $1 = $2 = $3 = ""
                                          sub(/^ +/, ""); print p, g, n, $0 }'
}

# decode NAME FILE EXPECTED...: check the capture; EXPECTED are the RDMAP
# messages that must appear: send, write, read.
decode() {
    local name=$1 file=$2
    shift 2
    local base=${file%.pcapng} req rep fpdu w rr rs s t other good bad tails nbad nundec why="" e
    read -r req rep fpdu w rr rs s t other < <(iwarp_counts "$file")
    # A bad CRC is no expert info, only the text of the CRC check field.
    tshark -r "$file" "${TSHARK_IWARP[@]}" -V -O iwarp_mpa >"$base.mpa" 2>"$base.mpa.err"
    good=$(grep -c '(Good CRC32)' "$base.mpa")
    bad=$(grep -c '(Bad CRC32' "$base.mpa")
    tails=$(grep -c '^wire_check.lua:' "$base.mpa.err")
    expert_rows "$file" >"$base.expert"
    awk '$1 != "TCP"' "$base.expert" >"$base.bad"
    tshark -r "$file" "${TSHARK_IWARP[@]}" -2 -Y "$UNDECODED" >"$base.undecoded" 2>/dev/null
    nbad=$(grep -c . "$base.bad")
    nundec=$(grep -c . "$base.undecoded")
    log "  capture: $(grep -oE '^[0-9]+ packets? captured' "$CAP_LOG" | grep -oE '^[0-9]+' || echo '?') packets, $(
        grep -oE '^[0-9]+ packets? dropped' "$CAP_LOG" | awk '{ n += $1 } END { print n + 0 }') dropped"
    if [ "$fpdu" -gt 0 ] && [ $((good + bad)) -eq 0 ]; then
        log "  MPA: $req request(s), $rep reply(s), $fpdu FPDUs without CRC (not negotiated)"
    else
        log "  MPA: $req request(s), $rep reply(s), $fpdu FPDUs; CRC: $good good, $bad bad"
    fi
    [ "$tails" -eq 0 ] ||
        log "  FPDU starts of < 8 bytes ending a segment after a reassembled FPDU: $tails (carried over by wire_check.lua)"
    log "  RDMAP: Write $w, Read Request $rr, Read Response $rs, Send $s, Terminate $t, other $other"
    log "  expert infos >= warning (but TCP's): $nbad; frames of TCP payload outside MPA: $nundec"
    awk '$1 == "TCP" { print "  (not counted: " $0 ")" }' "$base.expert"
    [ "$req" -ge 1 ] && [ "$rep" -eq "$req" ] || why="MPA requests/replies $req/$rep"
    [ "$fpdu" -ge 1 ] || why="${why:+$why, }no MPA FPDU"
    for e in "$@"; do
        case $e in
            send) [ "$s" -ge 1 ] || why="${why:+$why, }no Send" ;;
            write) [ "$w" -ge 1 ] || why="${why:+$why, }no RDMA Write" ;;
            read) [ "$rr" -ge 1 ] && [ "$rs" -ge 1 ] || why="${why:+$why, }no RDMA Read Request/Response" ;;
        esac
    done
    [ "$bad" -eq 0 ] || why="${why:+$why, }$bad bad CRC(s)"
    [ "$nbad" -eq 0 ] || why="${why:+$why, }malformed packets or iWARP expert warnings"
    [ "$nundec" -eq 0 ] || why="${why:+$why, }$nundec frame(s) of undecoded TCP payload"
    verdict "$name" "$file" "$why" || {
        [ "$nbad" -eq 0 ] || show_log "$base.bad" "malformed packets, expert warnings and errors (protocol group count summary)"
        [ "$nundec" -eq 0 ] || show_log "$base.undecoded" "frames with undecoded TCP payload"
    }
}

# verdict NAME FILE WHY: pass, or fail with WHY (and dropped packets, which
# fail any capture); 1 when failed.
verdict() {
    local why=$3
    if grep -qiE '[1-9][0-9]* packets? dropped' "$CAP_LOG"; then
        why="${why:+$why, }capture dropped packets: $(grep -iE 'dropped' "$CAP_LOG" | tr '\n' ' ')"
    fi
    if [ -z "$why" ]; then
        pass "$1: wire format"
        return 0
    fi
    fail "$1: wire format" "$why"
    log "  capture: $2 (kept with COMPAT_KEEP_LOGS=1)"
    return 1
}

# decode_ud NAME FILE: a capture of UD datagrams (docs/wire-protocol.md).
# Each UDP port in it is a QP's: all are decoded as RoCEv2 (InfiniBand over
# UDP).  Every datagram must be a UD Send (BTH opcode 0x64 or 0x65, with a
# DETH), with no malformed packet or expert warning, and none dropped by
# the capture.
decode_ud() {
    local name=$1 file=$2 base=${2%.pcapng} p nudp nud nbad why="" dargs=()
    for p in $(tshark -r "$file" -T fields -e udp.dstport 2>/dev/null | sort -u); do
        dargs+=(-d "udp.port==$p,infiniband")
    done
    nudp=$(tshark -r "$file" -Y udp 2>/dev/null | grep -c .)
    nud=$(tshark -r "$file" "${dargs[@]}" -Y \
        'infiniband.deth && (infiniband.bth.opcode == 100 || infiniband.bth.opcode == 101)' \
        2>/dev/null | grep -c .)
    { tshark -r "$file" "${dargs[@]}" -q -z expert,warn 2>/dev/null |
          awk '$1 ~ /^[0-9]+$/ && NF >= 4 && $3 != "TCP"' # (the probe's reset)
      tshark -r "$file" "${dargs[@]}" -Y _ws.malformed 2>/dev/null; } >"$base.bad"
    nbad=$(grep -c . "$base.bad")
    log "  capture: $(grep -oE '^[0-9]+ packets? captured' "$CAP_LOG" | grep -oE '^[0-9]+' || echo '?') packets"
    log "  UDP datagrams: $nudp; UD Sends decoded: $nud; malformed or expert warnings: $nbad"
    [ "$nudp" -ge 1 ] || why="no UDP datagram"
    [ "$nud" -eq "$nudp" ] || why="${why:+$why, }$((nudp - nud)) datagram(s) not decoded as a UD Send"
    [ "$nbad" -eq 0 ] || why="${why:+$why, }malformed packets or expert warnings"
    verdict "$name" "$file" "$why" ||
        [ "$nbad" -eq 0 ] || show_log "$base.bad" "malformed packets and expert warnings"
}

# name | program and arguments (both sides) | GID flag | expected RDMAP
# messages, or "ud" for datagrams over UDP
CASES=(
    "rc_pingpong|ibv_rc_pingpong -n 200|-g|send"
    "write_bw|ib_write_bw -d $DEV -F -n 200|-x|write"
    "read_bw|ib_read_bw -d $DEV -F -n 200|-x|read"
    "send_bw|ib_send_bw -d $DEV -F -n 200|-x|send"
    "read_bw_both_ways|ib_read_bw -d $DEV -F -b -s 1048576 -n 40|-x|read"
    "uc_pingpong|ibv_uc_pingpong -n 200|-g|send"
    "xrc_send_bw|ib_send_bw -d $DEV -F -c XRC -n 200|-x|send"
    "ud_pingpong|ibv_ud_pingpong -n 200 -s 2048|-g|ud"
    "ud_send_lat|ib_send_lat -d $DEV -F -c UD -n 200|-x|ud"
)

log "tshark: $(tshark --version 2>/dev/null | head -n 1)"
# What the veth captures hold, tshark decodes: a segment that completes an
# FPDU and ends 4 bytes into the next (wire_check.lua: without it, the FPDUs
# after it are framed wrongly), and a segment seen after the one that follows
# it (tcp.reassemble_out_of_order: without it, nothing after the gap).
decoder_case "FPDU header split after a reassembled FPDU" 0:20@3 20:20@4 40:@5
decoder_case "segment captured out of order" 0:50@3 50:50@5 100:@4
port=$PORT_BASE
for c in "${CASES[@]}"; do
    IFS='|' read -r cname prog gflag expect <<<"$c"
    name="wire $cname"
    budget_left "$name" || continue
    port=$(free_port "$port")
    log "== $name"
    filter=""
    [ "$expect" = ud ] && filter="udp or tcp port 9" # (and the probe)
    if ! capture_start "$cname" "$port" "$filter"; then
        fail "$name" "tshark did not start capturing on $VETH_B"
        continue
    fi
    run_pair "$name" "$T" "$port" \
        "$SRV_RUN $prog -p $port $gflag $SRV_GID" \
        "$CLI_RUN $prog -p $port $gflag $CLI_GID $SRV_IP"
    capture_stop
    pair_result "$name" ''
    if [ "$expect" = ud ]; then
        decode_ud "$name" "$CAP_FILE"
    else
        # shellcheck disable=SC2086  # the expected messages are words
        decode "$name" "$CAP_FILE" $expect
    fi
    port=$((port + 1))
done

# Multicast: mckey's sender in B, a member in A, over one group (IP
# multicast to port 4791, RoCEv2's, which Wireshark decodes by itself).
# mckey listens on no port: the member starts first and joins at once.
name="wire mckey multicast"
if budget_left "$name"; then
    log "== $name"
    if ! capture_start mckey 0 "udp or tcp port 9"; then
        fail "$name" "tshark did not start capturing on $VETH_B"
    else
        read -r -a srv <<<"$SRV_RUN mckey -m 239.1.2.9 -b $SRV_IP -C 20"
        read -r -a cli <<<"$CLI_RUN mckey -m 239.1.2.9 -b $CLI_IP -s -C 20"
        log "RUN server: ${srv[*]}"
        timeout -k 2 "$T" "${srv[@]}" >"$WORK/mckey.server.log" 2>&1 &
        spid=$!
        COMPAT_BG_PIDS+=("$spid")
        sleep 0.5
        log "RUN client: ${cli[*]}"
        timeout -k 2 "$T" "${cli[@]}" >"$WORK/mckey.client.log" 2>&1
        crc=$?
        wait "$spid"
        src=$?
        capture_stop
        if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] &&
           grep -q '^return status 0' "$WORK/mckey.server.log"; then
            pass "$name"
        else
            fail "$name" "mckey: server $src, client $crc"
            show_log "$WORK/mckey.server.log" "server"
            show_log "$WORK/mckey.client.log" "client"
        fi
        decode_ud "$name" "$CAP_FILE"
    fi
fi

finish
