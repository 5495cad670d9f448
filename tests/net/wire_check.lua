-- SPDX-License-Identifier: MIT
-- Loaded by wire_check.sh into tshark (-X lua_script:): works around a limit
-- of Wireshark's MPA dissector (packet-iwarp-mpa.c, 4.0 and later).
--
-- Its heuristic entry point takes a TCP payload only if it holds at least 8
-- bytes (MPA_SMALLEST_FPDU_LEN).  Within one payload, tcp_dissect_pdus carries
-- a short rest over to the next segment itself; but when a TCP segment first
-- completes an FPDU reassembled from earlier segments, TCP hands what follows
-- it to the heuristic dissectors as a new payload.  If fewer than 8 bytes of
-- the next FPDU end that segment (a segment boundary the sender's TCP put
-- there, e.g. 4 bytes into an FPDU header), the heuristic refuses them, the
-- bytes are dropped from reassembly, the next segment is read as starting an
-- FPDU, and every FPDU after it in that stream is framed wrongly: bad CRCs,
-- nonsense lengths and opcodes, although the stream is correct.
--
-- This heuristic, tried before Wireshark's own (Lua heuristics come first),
-- takes such a short payload of a TCP connection that began with an MPA
-- Request and asks TCP for one more segment, as tcp_dissect_pdus does; the
-- MPA dissector then decodes the reassembled bytes as usual.  It decides
-- nothing about the bytes: CRC, lengths and headers are still checked by
-- Wireshark's dissectors.  wire_check.sh checks first, on a capture it makes
-- with text2pcap, that the case is decoded right (so that this file is in
-- effect), and counts the carried tails (the lines written to stderr).

local ONE_MORE_SEGMENT = DESEGMENT_ONE_MORE_SEGMENT or 0x0fffffff
local MPA_SMALLEST_FPDU_LEN = 8
local mpa_conns = {}

-- The connection, the same for both directions.
local function conn_key(pinfo)
    local a = tostring(pinfo.src) .. "/" .. pinfo.src_port
    local b = tostring(pinfo.dst) .. "/" .. pinfo.dst_port
    if a < b then
        return a .. " " .. b
    end
    return b .. " " .. a
end

local shim = Proto("mpa_short_tail", "MPA: short tail carried over (wire_check.lua)")

local function heuristic(tvb, pinfo, tree)
    local n = tvb:len()

    if n >= 16 and tvb(0, 16):string() == "MPA ID Req Frame" then
        mpa_conns[conn_key(pinfo)] = true
        return false -- Wireshark's MPA dissector decodes it
    end
    if n >= MPA_SMALLEST_FPDU_LEN or not mpa_conns[conn_key(pinfo)] then
        return false
    end
    io.stderr:write(string.format(
        "wire_check.lua: frame %d: %d byte(s) of an FPDU after a reassembled one, carried to the next segment\n",
        pinfo.number, n))
    pinfo.desegment_offset = 0
    pinfo.desegment_len = ONE_MORE_SEGMENT
    return true
end

shim:register_heuristic("tcp", heuristic)
