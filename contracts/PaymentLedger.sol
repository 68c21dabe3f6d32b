// SPDX-License-Identifier: MIT
pragma solidity ^0.8.37;

/// @title PaymentLedger (version 2)
/// @notice Append-only record of Paygate payments. Each record() emits PaymentRecorded with
///         every field, and folds the record's digest into one running hash (`head`), so the
///         storage stays two slots however many payments are recorded: a node's cost per
///         block does not grow with the ledger, and every payment stays verifiable (replaying
///         the PaymentRecorded events, or the archived record() calls, in order gives `head`).
///         At most once per id is the caller's job (each record is one signed tx with its own
///         nonce). Version 1 kept one storage slot per id (`recorded`, `entryOf`); its record()
///         and event are the same, so a deployed version 1 keeps working with Paygate.
///         No full URL is ever recorded: `origin` is scheme://host[:port] (checked here) and
///         `pathHash` is the keccak256 of the path (computed by the caller).
contract PaymentLedger {
    uint256 public constant VERSION = 2;

    address public owner;
    /// @dev count + 1, so that the first record() does not pay for a zero-to-nonzero write.
    uint256 private _countPlusOne = 1;
    /// @notice keccak256(abi.encode(previous head, digest of the record)) after each record,
    ///         from bytes32(0); see digestOf.
    bytes32 public head;
    mapping(address account => bool) public isRecorder;

    event PaymentRecorded(
        bytes32 indexed id,
        bytes32 indexed parentTxHash,
        bytes32 indexed agentIdHash,
        string agentId,
        uint256 amount,
        string protocol,
        string origin,
        bytes32 pathHash,
        uint32 depth,
        uint64 timestamp
    );
    event RecorderSet(address indexed recorder, bool allowed);
    event OwnershipTransferred(address indexed previousOwner, address indexed newOwner);

    error NotOwner();
    error NotRecorder();
    error ZeroAddress();
    error ZeroId();
    error OriginNotBare();

    constructor() {
        owner = msg.sender;
        isRecorder[msg.sender] = true;
        emit OwnershipTransferred(address(0), msg.sender);
        emit RecorderSet(msg.sender, true);
    }

    modifier onlyOwner() {
        if (msg.sender != owner) revert NotOwner();
        _;
    }

    function transferOwnership(address newOwner) external onlyOwner {
        if (newOwner == address(0)) revert ZeroAddress();
        emit OwnershipTransferred(owner, newOwner);
        owner = newOwner;
    }

    function addRecorder(address recorder) external onlyOwner {
        if (recorder == address(0)) revert ZeroAddress();
        isRecorder[recorder] = true;
        emit RecorderSet(recorder, true);
    }

    function removeRecorder(address recorder) external onlyOwner {
        isRecorder[recorder] = false;
        emit RecorderSet(recorder, false);
    }

    /// @notice Records one payment (or an invocation root: depth 0, protocol "", amount
    ///         possibly 0).
    function record(
        bytes32 id,
        bytes32 parentTxHash,
        string calldata agentId,
        uint256 amount,
        string calldata protocol,
        string calldata origin,
        bytes32 pathHash,
        uint32 depth
    ) external {
        if (!isRecorder[msg.sender]) revert NotRecorder();
        if (id == bytes32(0)) revert ZeroId();
        _requireBareOrigin(origin);

        bytes32 agentIdHash = keccak256(bytes(agentId));
        uint64 timestamp = uint64(block.timestamp);
        bytes32 digest = _digest(id, parentTxHash, agentIdHash, amount, protocol, origin, pathHash, depth, timestamp);
        head = keccak256(abi.encode(head, digest));
        unchecked {
            ++_countPlusOne;
        }
        emit PaymentRecorded(
            id, parentTxHash, agentIdHash, agentId, amount, protocol, origin, pathHash, depth, timestamp
        );
    }

    /// @notice How many entries were recorded.
    function count() external view returns (uint256) {
        unchecked {
            return _countPlusOne - 1;
        }
    }

    /// @notice The digest record() folds into `head` for these fields and the block's timestamp.
    function digestOf(
        bytes32 id,
        bytes32 parentTxHash,
        string calldata agentId,
        uint256 amount,
        string calldata protocol,
        string calldata origin,
        bytes32 pathHash,
        uint32 depth,
        uint64 timestamp
    ) external pure returns (bytes32) {
        return _digest(id, parentTxHash, keccak256(bytes(agentId)), amount, protocol, origin, pathHash, depth, timestamp);
    }

    /// @notice The head after `previous` and one record of `digest`.
    function nextHead(bytes32 previous, bytes32 digest) external pure returns (bytes32) {
        return keccak256(abi.encode(previous, digest));
    }

    function _digest(
        bytes32 id,
        bytes32 parentTxHash,
        bytes32 agentIdHash,
        uint256 amount,
        string calldata protocol,
        string calldata origin,
        bytes32 pathHash,
        uint32 depth,
        uint64 timestamp
    ) private pure returns (bytes32) {
        return keccak256(
            abi.encode(
                id,
                parentTxHash,
                agentIdHash,
                amount,
                keccak256(bytes(protocol)),
                keccak256(bytes(origin)),
                pathHash,
                depth,
                timestamp
            )
        );
    }

    /// @dev Bytes never allowed in an origin: controls and space (0x00-0x20), '#', '?',
    ///      at sign (userinfo), DEL and non-ASCII (0x7f-0xff). Bit c set = byte c forbidden.
    ///      = ((1 << 0x21) - 1) | (1 << 0x23) | (1 << 0x3f) | (1 << 0x40) | (~0 << 0x7f)
    uint256 private constant _FORBIDDEN_ORIGIN_BYTES =
        0xffffffffffffffffffffffffffffffff800000000000000180000009ffffffff;

    /// @dev Rejects anything that is more than scheme://host[:port]: a forbidden byte (see
    ///      above) or a '/' other than the "//" right after the first ':'. The empty string
    ///      (invocation roots) is allowed. Costs roughly 125 gas per byte.
    function _requireBareOrigin(string calldata origin) private pure {
        bool bad;
        assembly ("memory-safe") {
            let start := origin.offset
            let end := add(start, origin.length)
            let slashes := 0
            for { let p := start } lt(p, end) { p := add(p, 1) } {
                let c := byte(0, calldataload(p))
                if and(shr(c, _FORBIDDEN_ORIGIN_BYTES), 1) { bad := 1 }
                if eq(c, 0x2f) {
                    // '/': allowed only as ':' '/' '/'
                    let prev := 0
                    if gt(p, start) { prev := byte(0, calldataload(sub(p, 1))) }
                    switch slashes
                    case 0 { if iszero(eq(prev, 0x3a)) { bad := 1 } }
                    case 1 { if iszero(eq(prev, 0x2f)) { bad := 1 } }
                    default { bad := 1 }
                    slashes := add(slashes, 1)
                }
            }
        }
        if (bad) revert OriginNotBare();
    }
}
